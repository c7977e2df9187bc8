// Method + path -> handler: the table the API layer gives (api::Service::routes), looked up for
// each request; a path that is not there is a 404, one asked with another method a 405 naming
// the methods it takes.
#pragma once

#include <boost/beast/http/verb.hpp>
#include <string>
#include <vector>

#include "core/api/service.h"

namespace kvrt::http {

class Router {
 public:
  explicit Router(std::vector<api::Route> routes);

  struct Match {
    const api::Handler* handler = nullptr;  // null: no route
    int status = 200;                        // 404 (no such path) or 405 (not that method)
    std::string allowed;                     // a 405's methods: "POST or GET"
  };
  Match find(boost::beast::http::verb method, const std::string& path) const;

 private:
  struct Entry {
    std::string path;
    boost::beast::http::verb method;
    api::Handler handler;
  };
  std::vector<Entry> entries_;
};

}  // namespace kvrt::http
