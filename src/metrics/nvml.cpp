// NVML loaded with dlopen; see nvml.h.
#include "metrics/nvml.h"

#include <dlfcn.h>

#include "trainyard/error.h"

namespace trainyard::metrics::nvml {

namespace {

template <typename Fn>
Fn symbol(void* handle, const char* name) {
  return reinterpret_cast<Fn>(dlsym(handle, name));
}

}  // namespace

Library::Opened Library::open(const std::string& path) {
  Opened opened;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    opened.not_found = true;
    opened.why = detail::concat(path, " could not be loaded (", why ? why : "unknown reason", ").");
    return opened;
  }
  std::unique_ptr<Library> lib(new Library());
  lib->handle_ = handle;  // closed by ~Library from here on
  const auto init = symbol<InitFn>(handle, "nvmlInit_v2");
  lib->shutdown_ = symbol<ShutdownFn>(handle, "nvmlShutdown");
  lib->get_count = symbol<GetCountFn>(handle, "nvmlDeviceGetCount_v2");
  lib->get_handle = symbol<GetHandleFn>(handle, "nvmlDeviceGetHandleByIndex_v2");
  if (!init || !lib->shutdown_ || !lib->get_count || !lib->get_handle) {
    opened.why = detail::concat(path,
                                " lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetCount_v2 or "
                                "nvmlDeviceGetHandleByIndex_v2; is it NVML?");
    lib->shutdown_ = nullptr;  // never initialised: no nvmlShutdown
    return opened;
  }
  if (const Return rc = init(); rc != kSuccess) {
    opened.why = detail::concat("nvmlInit_v2 from ", path, " failed with NVML error ", rc, ".");
    lib->shutdown_ = nullptr;
    return opened;
  }
  lib->get_name = symbol<GetNameFn>(handle, "nvmlDeviceGetName");
  lib->get_memory = symbol<GetMemoryFn>(handle, "nvmlDeviceGetMemoryInfo");
  lib->get_utilization = symbol<GetUtilizationFn>(handle, "nvmlDeviceGetUtilizationRates");
  lib->get_temperature = symbol<GetTemperatureFn>(handle, "nvmlDeviceGetTemperature");
  lib->get_power = symbol<GetPowerFn>(handle, "nvmlDeviceGetPowerUsage");
  lib->get_clock = symbol<GetClockFn>(handle, "nvmlDeviceGetClockInfo");
  lib->event_set_create = symbol<EventSetCreateFn>(handle, "nvmlEventSetCreate");
  lib->event_set_free = symbol<EventSetFreeFn>(handle, "nvmlEventSetFree");
  lib->register_events = symbol<RegisterEventsFn>(handle, "nvmlDeviceRegisterEvents");
  lib->event_set_wait = symbol<EventSetWaitFn>(handle, "nvmlEventSetWait_v2");
  opened.library = std::move(lib);
  return opened;
}

Library::~Library() {
  if (shutdown_) shutdown_();
  if (handle_) dlclose(handle_);
}

unsigned Library::device_count() const {
  unsigned count = 0;
  if (get_count(&count) != kSuccess) return 0;
  return count;
}

Device Library::device(unsigned index) const {
  Device device = nullptr;
  if (get_handle(index, &device) != kSuccess) return nullptr;
  return device;
}

}  // namespace trainyard::metrics::nvml
