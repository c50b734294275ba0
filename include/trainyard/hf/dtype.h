// Element types of Hugging Face weight files (safetensors names, torch storage types), their
// sizes, and the conversions a loader needs: bf16/fp16/fp32 to fp32, bf16 or fp16, with
// round-to-nearest-even where precision is lost. LibTorch-free; plain loops the compiler
// vectorises.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace trainyard::hf {

enum class Dtype : std::uint8_t { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL };

// Bytes per element: 4 for F32, 2 for F16 and BF16, ...
std::size_t element_size(Dtype dtype);

// The safetensors name ("F32", "BF16", ...), also used in every message.
std::string_view dtype_name(Dtype dtype);

// The dtype a safetensors name stands for; nullopt for names this library does not read
// ("F8_E4M3", "U16", ...).
std::optional<Dtype> parse_dtype(std::string_view safetensors_name);

// True for the floating-point types convert() accepts on either side: F32, F16, BF16, and F64 as
// a source.
bool is_convertible(Dtype from, Dtype to);

// Converts `count` elements from `src` (dtype `from`) to `dst` (dtype `to`). Same dtype: a copy
// of the bytes, for any dtype. Otherwise F32/F16/BF16/F64 to F32, F16 or BF16; narrowing rounds
// to nearest even, NaN stays NaN and overflow becomes infinity (as torch's .to() does). Throws
// InvalidArgumentError for another pair, naming both dtypes. src and dst must not overlap.
void convert(const void* src, Dtype from, void* dst, Dtype to, std::size_t count);

// One element, for tests and scalar code.
float bf16_to_f32(std::uint16_t bits);
float f16_to_f32(std::uint16_t bits);
std::uint16_t f32_to_bf16(float value);  // round to nearest even
std::uint16_t f32_to_f16(float value);   // round to nearest even

}  // namespace trainyard::hf
