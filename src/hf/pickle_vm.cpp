#include "pickle_vm.h"

#include <array>
#include <cstring>
#include <memory>
#include <unordered_map>

#include "trainyard/error.h"

namespace trainyard::hf::detail {
namespace {

// Note [Pickle allow-list]
// A pickle is a program: GLOBAL names any importable callable and REDUCE calls it, so loading
// an untrusted pytorch_model.bin with Python's pickle can run anything. This machine calls
// nothing. It knows the few globals torch.save emits for a state dict and interprets each one
// itself: collections.OrderedDict (an empty dict), torch._utils._rebuild_tensor_v2 (a tensor
// view of a storage), torch._utils._rebuild_parameter[_with_state] (a Parameter: its tensor),
// and torch.<Type>Storage (names a storage's element type, inside a persistent id). Any other
// GLOBAL is refused when it is read, before anything could use it.

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Global, Storage, Tensor };
  Kind kind = Kind::None;
  std::int64_t i = 0;           // Bool, Int
  double f = 0;                 // Float
  std::string s;                // String; Global: "module name"
  std::vector<ValuePtr> items;  // Tuple, List; Dict: key, value, key, value, ...
  PickledTensor tensor;         // Storage (the storage fields only), Tensor
};

ValuePtr make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

constexpr std::array<std::pair<std::string_view, Dtype>, 10> kStorageTypes{{
    {"torch FloatStorage", Dtype::F32},
    {"torch HalfStorage", Dtype::F16},
    {"torch BFloat16Storage", Dtype::BF16},
    {"torch DoubleStorage", Dtype::F64},
    {"torch LongStorage", Dtype::I64},
    {"torch IntStorage", Dtype::I32},
    {"torch ShortStorage", Dtype::I16},
    {"torch CharStorage", Dtype::I8},
    {"torch ByteStorage", Dtype::U8},
    {"torch BoolStorage", Dtype::BOOL},
}};
constexpr std::string_view kOrderedDict = "collections OrderedDict";
constexpr std::string_view kRebuildTensor = "torch._utils _rebuild_tensor_v2";
constexpr std::string_view kRebuildParameter = "torch._utils _rebuild_parameter";
constexpr std::string_view kRebuildParameterWithState =
    "torch._utils _rebuild_parameter_with_state";

bool allowed_global(std::string_view name) {
  if (name == kOrderedDict || name == kRebuildTensor || name == kRebuildParameter ||
      name == kRebuildParameterWithState)
    return true;
  for (const auto& [n, d] : kStorageTypes)
    if (n == name) return true;
  return false;
}

class Machine {
 public:
  Machine(std::string_view code, const std::string& what) : code_(code), what_(what) {}

  ValuePtr run();

 private:
  template <typename... Parts>
  CheckpointCorruptError corrupt(const Parts&... parts) const {
    return CheckpointCorruptError(::trainyard::detail::concat(
        what_, " is not a state dict torch.save could have written: ", parts..., " (at byte ",
        op_pos_, ")."));
  }
  std::string_view take(std::size_t n) {
    if (n > code_.size() - pos_) throw corrupt("the pickle ends early");
    auto s = code_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint64_t uint_le(std::size_t n) {
    const auto s = take(n);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i)
      v |= std::uint64_t(static_cast<unsigned char>(s[i])) << (8 * i);
    return v;
  }
  std::string_view line() {
    const auto end = code_.find('\n', pos_);
    if (end == std::string_view::npos) throw corrupt("an unterminated GLOBAL");
    auto s = code_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  ValuePtr pop() {
    if (stack_.size() <= mark_floor()) throw corrupt("a pop from an empty stack");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::size_t mark_floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<ValuePtr> pop_to_mark() {
    if (marks_.empty()) throw corrupt("no MARK to pop to");
    std::vector<ValuePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                                stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  ValuePtr& top() {
    if (stack_.size() <= mark_floor()) throw corrupt("an empty stack");
    return stack_.back();
  }
  void push_global(std::string name);
  ValuePtr persistent_load(const ValuePtr& pid);
  ValuePtr reduce(const ValuePtr& callable, const ValuePtr& args);
  std::int64_t as_int(const ValuePtr& v, const char* what) const {
    if (v->kind != Value::Kind::Int && v->kind != Value::Kind::Bool)
      throw corrupt(what, " is not an int");
    return v->i;
  }
  std::vector<std::int64_t> as_ints(const ValuePtr& v, const char* what) const {
    if (v->kind != Value::Kind::Tuple) throw corrupt(what, " is not a tuple");
    std::vector<std::int64_t> out;
    for (const auto& x : v->items) out.push_back(as_int(x, what));
    return out;
  }

  std::string_view code_;
  const std::string& what_;
  std::size_t pos_ = 0;
  std::size_t op_pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, ValuePtr> memo_;
};

void Machine::push_global(std::string name) {
  if (!allowed_global(name))
    throw corrupt("it names the Python global '", name,
                  "', which is not on the allow-list of what torch.save writes for tensors "
                  "(see Note [Pickle allow-list] in src/hf/pickle_vm.cpp); loading it would mean "
                  "running code from the file, which trainyard never does. HINT: re-save the "
                  "plain state dict, or convert the weights to safetensors");
  auto v = make(Value::Kind::Global);
  v->s = std::move(name);
  stack_.push_back(std::move(v));
}

ValuePtr Machine::persistent_load(const ValuePtr& pid) {
  // ('storage', torch.<Type>Storage, key, location, numel)
  if (pid->kind != Value::Kind::Tuple || pid->items.size() != 5 ||
      pid->items[0]->kind != Value::Kind::String || pid->items[0]->s != "storage" ||
      pid->items[1]->kind != Value::Kind::Global || pid->items[2]->kind != Value::Kind::String)
    throw corrupt("a persistent id that is not ('storage', type, key, location, numel)");
  auto v = make(Value::Kind::Storage);
  bool known = false;
  for (const auto& [n, d] : kStorageTypes)
    if (n == pid->items[1]->s) {
      v->tensor.dtype = d;
      known = true;
    }
  if (!known) throw corrupt("a storage of type '", pid->items[1]->s, "'");
  v->tensor.storage_key = pid->items[2]->s;
  const auto numel = as_int(pid->items[4], "a storage's element count");
  if (numel < 0) throw corrupt("a storage with ", numel, " elements");
  v->tensor.storage_numel = static_cast<std::uint64_t>(numel);
  return v;
}

ValuePtr Machine::reduce(const ValuePtr& callable, const ValuePtr& args) {
  if (callable->kind != Value::Kind::Global || args->kind != Value::Kind::Tuple)
    throw corrupt("a REDUCE that does not call a global with a tuple");
  const std::string& name = callable->s;
  const auto& a = args->items;
  if (name == kOrderedDict) {
    if (!a.empty()) throw corrupt("OrderedDict called with arguments");
    return make(Value::Kind::Dict);
  }
  if (name == kRebuildTensor) {
    // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
    if (a.size() < 6 || a[0]->kind != Value::Kind::Storage)
      throw corrupt("_rebuild_tensor_v2 called without (storage, offset, size, stride, ...)");
    auto v = make(Value::Kind::Tensor);
    v->tensor = a[0]->tensor;
    const auto offset = as_int(a[1], "a tensor's storage offset");
    if (offset < 0) throw corrupt("a tensor at storage offset ", offset);
    v->tensor.storage_offset = static_cast<std::uint64_t>(offset);
    v->tensor.size = as_ints(a[2], "a tensor's size");
    v->tensor.stride = as_ints(a[3], "a tensor's stride");
    if (v->tensor.size.size() != v->tensor.stride.size())
      throw corrupt("a tensor with ", v->tensor.size.size(), " sizes and ", v->tensor.stride.size(),
                    " strides");
    return v;
  }
  if (name == kRebuildParameter || name == kRebuildParameterWithState) {
    if (a.empty() || a[0]->kind != Value::Kind::Tensor)
      throw corrupt(name, " called without a tensor");
    return a[0];
  }
  throw corrupt("a call of '", name, "', which builds no tensor");
}

ValuePtr Machine::run() {
  using K = Value::Kind;
  while (true) {
    op_pos_ = pos_;
    const auto op = static_cast<unsigned char>(take(1)[0]);
    switch (op) {
      case 0x80:
        take(1);
        break;  // PROTO
      case 0x95:
        take(8);
        break;  // FRAME
      case '(':
        marks_.push_back(stack_.size());
        break;  // MARK
      case '}':
        stack_.push_back(make(K::Dict));
        break;  // EMPTY_DICT
      case ']':
        stack_.push_back(make(K::List));
        break;  // EMPTY_LIST
      case ')':
        stack_.push_back(make(K::Tuple));
        break;  // EMPTY_TUPLE
      case 'N':
        stack_.push_back(make(K::None));
        break;      // NONE
      case 0x88:    // NEWTRUE
      case 0x89: {  // NEWFALSE
        auto v = make(K::Bool);
        v->i = op == 0x88;
        stack_.push_back(std::move(v));
        break;
      }
      case 'K':    // BININT1
      case 'M':    // BININT2
      case 'J': {  // BININT
        auto v = make(K::Int);
        const std::size_t n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
        const auto u = uint_le(n);
        v->i = n == 4 ? static_cast<std::int32_t>(u) : static_cast<std::int64_t>(u);
        stack_.push_back(std::move(v));
        break;
      }
      case 0x8a: {  // LONG1: little-endian two's complement, here at most 8 bytes
        const auto n = uint_le(1);
        if (n > 8) throw corrupt("an integer of ", n, " bytes");
        std::uint64_t u = n ? uint_le(n) : 0;
        if (n > 0 && n < 8 && (u >> (8 * n - 1)) & 1) u |= ~std::uint64_t(0) << (8 * n);
        auto v = make(K::Int);
        v->i = static_cast<std::int64_t>(u);
        stack_.push_back(std::move(v));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        const auto s = take(8);
        std::uint64_t u = 0;
        for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<unsigned char>(s[i]);
        auto v = make(K::Float);
        std::memcpy(&v->f, &u, 8);
        stack_.push_back(std::move(v));
        break;
      }
      case 'X':     // BINUNICODE
      case 0x8c:    // SHORT_BINUNICODE
      case 0x8d:    // BINUNICODE8
      case 'B':     // BINBYTES
      case 'C':     // SHORT_BINBYTES
      case 0x8e: {  // BINBYTES8
        const std::size_t n = (op == 0x8c || op == 'C') ? 1 : (op == 0x8d || op == 0x8e) ? 8 : 4;
        const auto len = uint_le(n);
        auto v = make(K::String);
        v->s = std::string(take(len));
        stack_.push_back(std::move(v));
        break;
      }
      case 'c': {  // GLOBAL "module\nname\n"
        std::string module(line());
        std::string name(line());
        push_global(module + " " + name);
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        auto name = pop();
        auto module = pop();
        if (module->kind != K::String || name->kind != K::String)
          throw corrupt("STACK_GLOBAL without two strings");
        push_global(module->s + " " + name->s);
        break;
      }
      case 'Q': {  // BINPERSID
        auto pid = pop();
        stack_.push_back(persistent_load(pid));
        break;
      }
      case 't': {  // TUPLE
        auto v = make(K::Tuple);
        v->items = pop_to_mark();
        stack_.push_back(std::move(v));
        break;
      }
      case 0x85:    // TUPLE1
      case 0x86:    // TUPLE2
      case 0x87: {  // TUPLE3
        const std::size_t n = op - 0x84;
        auto v = make(K::Tuple);
        v->items.resize(n);
        for (std::size_t i = n; i-- > 0;) v->items[i] = pop();
        stack_.push_back(std::move(v));
        break;
      }
      case 'l': {  // LIST
        auto v = make(K::List);
        v->items = pop_to_mark();
        stack_.push_back(std::move(v));
        break;
      }
      case 'd': {  // DICT
        auto v = make(K::Dict);
        v->items = pop_to_mark();
        if (v->items.size() % 2) throw corrupt("DICT with an odd number of items");
        stack_.push_back(std::move(v));
        break;
      }
      case 'R': {  // REDUCE
        auto args = pop();
        auto callable = pop();
        stack_.push_back(reduce(callable, args));
        break;
      }
      case 'b': {  // BUILD: the state of an OrderedDict (its _metadata attribute) is dropped
        pop();
        if (top()->kind != K::Dict) throw corrupt("BUILD on something other than a dict");
        break;
      }
      case 's': {  // SETITEM
        auto value = pop();
        auto key = pop();
        auto& dict = top();
        if (dict->kind != K::Dict) throw corrupt("SETITEM on something other than a dict");
        dict->items.push_back(std::move(key));
        dict->items.push_back(std::move(value));
        break;
      }
      case 'u': {  // SETITEMS
        auto items = pop_to_mark();
        auto& dict = top();
        if (dict->kind != K::Dict || items.size() % 2)
          throw corrupt("SETITEMS on something other than a dict, or with an odd item count");
        for (auto& x : items) dict->items.push_back(std::move(x));
        break;
      }
      case 'a': {  // APPEND
        auto value = pop();
        if (top()->kind != K::List) throw corrupt("APPEND on something other than a list");
        top()->items.push_back(std::move(value));
        break;
      }
      case 'e': {  // APPENDS
        auto items = pop_to_mark();
        if (top()->kind != K::List) throw corrupt("APPENDS on something other than a list");
        for (auto& x : items) top()->items.push_back(std::move(x));
        break;
      }
      case 'q':
        memo_[uint_le(1)] = top();
        break;  // BINPUT
      case 'r':
        memo_[uint_le(4)] = top();
        break;  // LONG_BINPUT
      case 0x94:
        memo_[memo_.size()] = top();
        break;     // MEMOIZE
      case 'h':    // BINGET
      case 'j': {  // LONG_BINGET
        const auto key = uint_le(op == 'h' ? 1 : 4);
        const auto it = memo_.find(key);
        if (it == memo_.end()) throw corrupt("a GET of memo entry ", key, ", never PUT");
        stack_.push_back(it->second);
        break;
      }
      case '0':
        pop();
        break;  // POP
      case '1':
        pop_to_mark();
        break;  // POP_MARK
      case '2':
        stack_.push_back(top());
        break;     // DUP
      case '.': {  // STOP
        if (stack_.size() != 1 || !marks_.empty())
          throw corrupt("STOP with ", stack_.size(), " values on the stack");
        return stack_.back();
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        throw corrupt("pickle opcode ", hex, " ('",
                      static_cast<char>(op >= 32 && op < 127 ? op : '?'),
                      "'), which torch.save does not emit for a state dict");
      }
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, PickledTensor>> load_pickled_state_dict(
    std::string_view pickle, const std::string& what) {
  auto root = Machine(pickle, what).run();
  if (root->kind != Value::Kind::Dict)
    throw CheckpointCorruptError(::trainyard::detail::concat(
        what, " holds no state dict: its top-level object is not a dict."));
  std::vector<std::pair<std::string, PickledTensor>> out;
  std::vector<std::string> other_keys;
  for (std::size_t i = 0; i + 1 < root->items.size(); i += 2) {
    const auto& key = root->items[i];
    const auto& value = root->items[i + 1];
    if (key->kind != Value::Kind::String)
      throw CheckpointCorruptError(
          ::trainyard::detail::concat(what, " has a state dict key that is not a string."));
    if (value->kind == Value::Kind::Tensor)
      out.emplace_back(key->s, value->tensor);
    else
      other_keys.push_back(key->s);
  }
  if (out.empty() && !other_keys.empty())
    throw CheckpointCorruptError(::trainyard::detail::concat(
        what, " holds no tensors at its top level (keys such as '", other_keys.front(),
        "'): it is a nested checkpoint, not a model's state dict."));
  return out;
}

}  // namespace trainyard::hf::detail
