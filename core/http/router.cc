#include "core/http/router.h"

#include <boost/beast/http/verb.hpp>
#include <utility>

namespace kvrt::http {

namespace beast_http = boost::beast::http;

Router::Router(std::vector<api::Route> routes) {
  for (api::Route& r : routes) {
    entries_.push_back({r.path, beast_http::string_to_verb(r.method), std::move(r.handler)});
  }
}

Router::Match Router::find(beast_http::verb method, const std::string& path) const {
  Match match;
  for (const Entry& e : entries_) {
    if (path != e.path) continue;
    if (e.method == method && match.handler == nullptr) match.handler = &e.handler;
    match.allowed += (match.allowed.empty() ? "" : " or ") +
                     std::string(beast_http::to_string(e.method));
  }
  if (match.handler == nullptr) match.status = match.allowed.empty() ? 404 : 405;
  return match;
}

}  // namespace kvrt::http
