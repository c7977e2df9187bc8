#include "core/serve/eos.h"

namespace kvrt::serve {

void add_eos_stop_ids(const std::vector<int32_t>& eos, bool ignore_eos,
                      std::vector<int32_t>* stop_ids) {
  if (ignore_eos) return;
  stop_ids->insert(stop_ids->end(), eos.begin(), eos.end());
}

}  // namespace kvrt::serve
