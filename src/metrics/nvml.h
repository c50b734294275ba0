// NVML (NVIDIA's management library) loaded with dlopen at run time, so that trainyard builds
// and runs without NVIDIA's headers or driver. Private to trainyard: the node sampler
// (metrics/node_sampler.cpp) and resource detection (cluster/node_resources.cpp) share it.
#pragma once

#include <memory>
#include <string>

namespace trainyard::metrics::nvml {

// The few types of NVML's C API we use, declared after nvml.h (the C ABI of these entry points
// is stable across driver versions). nvmlReturn_t is an enum whose success value is 0.
using Return = int;
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorTimeout = 10;  // NVML_ERROR_TIMEOUT: no event waiting

struct DeviceOpaque;
using Device = DeviceOpaque*;  // nvmlDevice_t
struct EventSetOpaque;
using EventSet = EventSetOpaque*;  // nvmlEventSet_t

struct Memory {  // nvmlMemory_t (version 1), bytes
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct Utilization {  // nvmlUtilization_t, percent over the driver's last sample period
  unsigned gpu;
  unsigned memory;
};
struct EventData {  // nvmlEventData_t (the two instance ids arrived with NVML 11)
  Device device;
  unsigned long long event_type;
  unsigned long long event_data;  // the XID for an XID event
  unsigned gpu_instance_id;
  unsigned compute_instance_id;
};

inline constexpr unsigned kDeviceNameBufferSize = 96;         // NVML_DEVICE_NAME_V2_BUFFER_SIZE
inline constexpr int kTemperatureGpu = 0;                     // NVML_TEMPERATURE_GPU
inline constexpr int kClockSm = 1;                            // NVML_CLOCK_SM
inline constexpr unsigned long long kEventXidCritical = 0x8;  // nvmlEventTypeXidCriticalError

using InitFn = Return (*)();
using ShutdownFn = Return (*)();
using GetCountFn = Return (*)(unsigned*);
using GetHandleFn = Return (*)(unsigned, Device*);
using GetNameFn = Return (*)(Device, char*, unsigned);
using GetMemoryFn = Return (*)(Device, Memory*);
using GetUtilizationFn = Return (*)(Device, Utilization*);
using GetTemperatureFn = Return (*)(Device, int, unsigned*);  // degrees C
using GetPowerFn = Return (*)(Device, unsigned*);             // milliwatts
using GetClockFn = Return (*)(Device, int, unsigned*);        // MHz
using EventSetCreateFn = Return (*)(EventSet*);
using EventSetFreeFn = Return (*)(EventSet);
using RegisterEventsFn = Return (*)(Device, unsigned long long, EventSet);
using EventSetWaitFn = Return (*)(EventSet, EventData*, unsigned);  // timeout in ms

// NVML loaded and initialised: open() dlopens the library and calls nvmlInit_v2, the destructor
// calls nvmlShutdown and dlcloses it (NVML counts initialisations, so several may be open).
// The entry points beyond the four every user needs are null when the library lacks them.
// NVML's functions are thread-safe.
class Library {
 public:
  struct Opened {
    std::unique_ptr<Library> library;  // null when it could not be opened
    bool not_found = false;            // the library did not load (no NVIDIA driver): not an error
    std::string why;                   // why it is null, a sentence
  };
  static Opened open(const std::string& path);

  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  // The number of GPUs (0 when nvmlDeviceGetCount_v2 fails) and the handle of one (null when
  // nvmlDeviceGetHandleByIndex_v2 fails).
  unsigned device_count() const;
  Device device(unsigned index) const;

  // Always present after open().
  GetCountFn get_count = nullptr;
  GetHandleFn get_handle = nullptr;
  // Each null when the library lacks it.
  GetNameFn get_name = nullptr;
  GetMemoryFn get_memory = nullptr;
  GetUtilizationFn get_utilization = nullptr;
  GetTemperatureFn get_temperature = nullptr;
  GetPowerFn get_power = nullptr;
  GetClockFn get_clock = nullptr;
  EventSetCreateFn event_set_create = nullptr;
  EventSetFreeFn event_set_free = nullptr;
  RegisterEventsFn register_events = nullptr;
  EventSetWaitFn event_set_wait = nullptr;

 private:
  Library() = default;
  void* handle_ = nullptr;  // owned (dlclose)
  ShutdownFn shutdown_ = nullptr;
};

}  // namespace trainyard::metrics::nvml
