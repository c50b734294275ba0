// A stand-in for NVIDIA's libnvidia-ml.so with two GPUs of known readings, for the node sampler's
// tests (trainyard loads NVML with dlopen, so a test can hand it this library instead).
//   GPU 0: 75 % busy, 40 % memory copy, 1 GiB of 80 GiB used, 65 C, 250 W, SM clock 1410 MHz,
//          three critical XID events (and one event of another type) queued at nvmlInit_v2.
//   GPU 1: utilisation and temperature not supported, 2 GiB of 40 GiB, 100.5 W, 1980 MHz.
#include <deque>

namespace {

constexpr int kSuccess = 0;
constexpr int kErrorInvalidArgument = 2;
constexpr int kErrorNotSupported = 3;
constexpr int kErrorTimeout = 10;
constexpr unsigned long long kXid = 0x8;
constexpr unsigned long long kSingleBitEcc = 0x1;

struct Device {
  int index;
};
Device devices[2] = {{0}, {1}};
struct EventSet {};
EventSet event_set;
struct Event {
  Device* device;
  unsigned long long type;
  unsigned long long data;
};
std::deque<Event> events;
bool registered[2] = {false, false};

}  // namespace

extern "C" {

struct FakeMemory {
  unsigned long long total, free, used;
};
struct FakeUtilization {
  unsigned gpu, memory;
};
struct FakeEventData {
  Device* device;
  unsigned long long event_type;
  unsigned long long event_data;
  unsigned gpu_instance_id;
  unsigned compute_instance_id;
};

int nvmlInit_v2() {
  events.clear();
  registered[0] = registered[1] = false;
  events.push_back({&devices[0], kXid, 79});
  events.push_back({&devices[0], kSingleBitEcc, 0});
  events.push_back({&devices[0], kXid, 48});
  events.push_back({&devices[0], kXid, 79});
  return kSuccess;
}
int nvmlShutdown() {
  return kSuccess;
}
int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = 2;
  return kSuccess;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned index, Device** device) {
  if (index >= 2) return kErrorInvalidArgument;
  *device = &devices[index];
  return kSuccess;
}
int nvmlDeviceGetName(Device* device, char* name, unsigned length) {
  const char* text = device->index == 0 ? "Fake H100" : "Fake A100";
  unsigned i = 0;
  for (; text[i] != '\0' && i + 1 < length; ++i) name[i] = text[i];
  name[i] = '\0';
  return kSuccess;
}
int nvmlDeviceGetMemoryInfo(Device* device, FakeMemory* memory) {
  const unsigned long long gib = 1ull << 30;
  memory->total = device->index == 0 ? 80 * gib : 40 * gib;
  memory->used = device->index == 0 ? 1 * gib : 2 * gib;
  memory->free = memory->total - memory->used;
  return kSuccess;
}
int nvmlDeviceGetUtilizationRates(Device* device, FakeUtilization* utilization) {
  if (device->index != 0) return kErrorNotSupported;
  utilization->gpu = 75;
  utilization->memory = 40;
  return kSuccess;
}
int nvmlDeviceGetTemperature(Device* device, int sensor, unsigned* celsius) {
  if (device->index != 0 || sensor != 0) return kErrorNotSupported;
  *celsius = 65;
  return kSuccess;
}
int nvmlDeviceGetPowerUsage(Device* device, unsigned* milliwatts) {
  *milliwatts = device->index == 0 ? 250000 : 100500;
  return kSuccess;
}
int nvmlDeviceGetClockInfo(Device* device, int type, unsigned* mhz) {
  if (type != 1) return kErrorInvalidArgument;  // only NVML_CLOCK_SM
  *mhz = device->index == 0 ? 1410 : 1980;
  return kSuccess;
}
int nvmlEventSetCreate(EventSet** set) {
  *set = &event_set;
  return kSuccess;
}
int nvmlEventSetFree(EventSet*) {
  return kSuccess;
}
int nvmlDeviceRegisterEvents(Device* device, unsigned long long types, EventSet*) {
  if ((types & kXid) == 0) return kErrorInvalidArgument;
  registered[device->index] = true;
  return kSuccess;
}
int nvmlEventSetWait_v2(EventSet*, FakeEventData* data, unsigned) {
  while (!events.empty() && !registered[events.front().device->index]) events.pop_front();
  if (events.empty()) return kErrorTimeout;
  const Event e = events.front();
  events.pop_front();
  *data = FakeEventData{e.device, e.type, e.data, 0, 0};
  return kSuccess;
}

}  // extern "C"
