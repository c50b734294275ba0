#include "trainyard/hf/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>

#include "trainyard/error.h"

namespace trainyard::hf {
namespace {

struct DtypeRow {
  Dtype dtype;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DtypeRow, 10> kDtypes{{
    {Dtype::F32, "F32", 4},
    {Dtype::F16, "F16", 2},
    {Dtype::BF16, "BF16", 2},
    {Dtype::F64, "F64", 8},
    {Dtype::I64, "I64", 8},
    {Dtype::I32, "I32", 4},
    {Dtype::I16, "I16", 2},
    {Dtype::I8, "I8", 1},
    {Dtype::U8, "U8", 1},
    {Dtype::BOOL, "BOOL", 1},
}};

const DtypeRow& row(Dtype dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  TY_ASSERT(i < kDtypes.size() && kDtypes[i].dtype == dtype, "bad Dtype ", i);
  return kDtypes[i];
}

// Note [Branch-free conversions]
// Each element conversion below is straight-line integer and float arithmetic with selects
// instead of branches, so g++ -O2/-O3 vectorises the loops in convert_loop() (SSE2 without any
// -march flag). fp16 <-> fp32 follows Marat Dukhan's FP16 library (the method PyTorch's
// c10/util/Half.h uses); fp32 -> bf16 adds 0x7fff plus the lowest kept bit, which rounds to
// nearest even, and keeps NaN a (quiet) NaN instead of letting the carry turn it into infinity.

inline float f32_from_bits(std::uint32_t w) {
  return std::bit_cast<float>(w);
}
inline std::uint32_t f32_bits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}

inline float bf16_to_f32_impl(std::uint16_t h) {
  return f32_from_bits(std::uint32_t(h) << 16);
}

inline std::uint16_t f32_to_bf16_impl(float f) {
  const std::uint32_t w = f32_bits(f);
  const std::uint32_t rounded = (w + 0x7fffu + ((w >> 16) & 1u)) >> 16;
  const bool nan = (w & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(nan ? ((w >> 16) | 0x40u) : rounded);
}

inline float f16_to_f32_impl(std::uint16_t h) {
  const std::uint32_t w = std::uint32_t(h) << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;
  constexpr std::uint32_t kExpOffset = 0xe0u << 23;
  constexpr float kExpScale = 0x1.0p-112f;
  const float normalized = f32_from_bits((two_w >> 4) + kExpOffset) * kExpScale;
  constexpr std::uint32_t kMagicMask = 126u << 23;
  constexpr float kMagicBias = 0.5f;
  const float denormalized = f32_from_bits((two_w >> 17) | kMagicMask) - kMagicBias;
  constexpr std::uint32_t kDenormalizedCutoff = 1u << 27;
  // A mask, not ?:, which g++ turns into a branch here (no vectorising).
  const std::uint32_t denormal_mask = 0u - static_cast<std::uint32_t>(two_w < kDenormalizedCutoff);
  const std::uint32_t result =
      sign | (denormal_mask & f32_bits(denormalized)) | (~denormal_mask & f32_bits(normalized));
  return f32_from_bits(result);
}

inline std::uint16_t f32_to_f16_impl(float f) {
  constexpr float kScaleToInf = 0x1.0p+112f;
  constexpr float kScaleToZero = 0x1.0p-110f;
  float base = (std::fabs(f) * kScaleToInf) * kScaleToZero;
  const std::uint32_t w = f32_bits(f);
  const std::uint32_t shl1_w = w + w;
  const std::uint32_t sign = w & 0x80000000u;
  std::uint32_t bias = shl1_w & 0xff000000u;
  bias = std::max(bias, 0x71000000u);
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const std::uint32_t bits = f32_bits(base);
  const std::uint32_t exp_bits = (bits >> 13) & 0x00007c00u;
  const std::uint32_t mantissa_bits = bits & 0x00000fffu;
  const std::uint32_t nonsign = exp_bits + mantissa_bits;
  // NaN becomes 0x7e00; a mask, not ?:, which g++ turns into a branch here (no vectorising).
  const std::uint32_t nan_mask = 0u - static_cast<std::uint32_t>(shl1_w > 0xff000000u);
  return static_cast<std::uint16_t>((sign >> 16) | (nan_mask & 0x7e00u) | (~nan_mask & nonsign));
}

// Loads an element of type From as float (F64 narrows here, rounding to nearest).
template <Dtype From>
inline float load(const unsigned char* p, std::size_t i) {
  if constexpr (From == Dtype::F32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  } else if constexpr (From == Dtype::F64) {
    double v;
    std::memcpy(&v, p + 8 * i, 8);
    return static_cast<float>(v);
  } else {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return From == Dtype::F16 ? f16_to_f32_impl(h) : bf16_to_f32_impl(h);
  }
}

template <Dtype To>
inline void store(unsigned char* p, std::size_t i, float v) {
  if constexpr (To == Dtype::F32) {
    std::memcpy(p + 4 * i, &v, 4);
  } else {
    const std::uint16_t h = To == Dtype::F16 ? f32_to_f16_impl(v) : f32_to_bf16_impl(v);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

// See Note [Branch-free conversions].
template <Dtype From, Dtype To>
void convert_loop(const void* src, void* dst, std::size_t count) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  for (std::size_t i = 0; i < count; ++i) store<To>(d, i, load<From>(s, i));
}

template <Dtype To>
void convert_to(const void* src, Dtype from, void* dst, std::size_t count) {
  switch (from) {
    case Dtype::F32:
      return convert_loop<Dtype::F32, To>(src, dst, count);
    case Dtype::F16:
      return convert_loop<Dtype::F16, To>(src, dst, count);
    case Dtype::BF16:
      return convert_loop<Dtype::BF16, To>(src, dst, count);
    case Dtype::F64:
      return convert_loop<Dtype::F64, To>(src, dst, count);
    default:
      TY_ASSERT(false, "convert_to: unchecked source dtype ", dtype_name(from));
  }
}

bool is_float_target(Dtype d) {
  return d == Dtype::F32 || d == Dtype::F16 || d == Dtype::BF16;
}

}  // namespace

std::size_t element_size(Dtype dtype) {
  return row(dtype).size;
}

std::string_view dtype_name(Dtype dtype) {
  return row(dtype).name;
}

std::optional<Dtype> parse_dtype(std::string_view safetensors_name) {
  for (const auto& r : kDtypes)
    if (r.name == safetensors_name) return r.dtype;
  return std::nullopt;
}

bool is_convertible(Dtype from, Dtype to) {
  return from == to || (is_float_target(to) && (is_float_target(from) || from == Dtype::F64));
}

void convert(const void* src, Dtype from, void* dst, Dtype to, std::size_t count) {
  TY_CHECK(is_convertible(from, to), "Cannot convert ", dtype_name(from), " elements to ",
           dtype_name(to),
           ": only F32, F16, BF16 and F64 convert, to F32, F16 or BF16. HINT: read ",
           dtype_name(from), " tensors as ", dtype_name(from), ".");
  if (from == to) {
    if (count != 0) std::memcpy(dst, src, count * element_size(from));
    return;
  }
  switch (to) {
    case Dtype::F32:
      return convert_to<Dtype::F32>(src, from, dst, count);
    case Dtype::F16:
      return convert_to<Dtype::F16>(src, from, dst, count);
    case Dtype::BF16:
      return convert_to<Dtype::BF16>(src, from, dst, count);
    default:
      TY_ASSERT(false, "convert: unchecked target dtype ", dtype_name(to));
  }
}

float bf16_to_f32(std::uint16_t bits) {
  return bf16_to_f32_impl(bits);
}
float f16_to_f32(std::uint16_t bits) {
  return f16_to_f32_impl(bits);
}
std::uint16_t f32_to_bf16(float value) {
  return f32_to_bf16_impl(value);
}
std::uint16_t f32_to_f16(float value) {
  return f32_to_f16_impl(value);
}

}  // namespace trainyard::hf
