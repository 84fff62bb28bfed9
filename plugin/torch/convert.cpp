// Conversions and checks shared by the backend's lifecycle and its
// collectives: torch dtypes and ReduceOps to libsmddp's, tensor checks, and
// the error text of a failed C call.
#include "convert.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <sstream>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace smddp_torch {
namespace detail {

const char* const kAcceptedDtypes =
    "float32, float64, float16, bfloat16, int8, uint8, int16, uint16, int32, uint32, int64, "
    "uint64, bool (reductions of bool are logical: SUM and MAX or, PRODUCT and MIN and, as in "
    "gloo), complex32, complex64 and complex128 (reductions: SUM, AVG, PREMUL_SUM, over the "
    "real and imaginary parts), float8 types (data movement only)";

[[noreturn]] void throw_backend_error(const std::string& msg) {
  C10_THROW_ERROR(DistBackendError, msg);
}

smddp_dtype_t to_smddp_dtype(at::ScalarType type, bool reduces) {
  switch (type) {
    case at::kFloat:
      return SMDDP_FLOAT32;
    case at::kDouble:
      return SMDDP_FLOAT64;
    case at::kHalf:
      return SMDDP_FLOAT16;
    case at::kBFloat16:
      return SMDDP_BFLOAT16;
    case at::kChar:
      return SMDDP_INT8;
    case at::kByte:
      return SMDDP_UINT8;
    case at::kInt:
      return SMDDP_INT32;
    case at::kLong:
      return SMDDP_INT64;
    case at::kShort:
      return SMDDP_INT16;
    case at::kUInt16:
      return SMDDP_UINT16;
    case at::kUInt32:
      return SMDDP_UINT32;
    case at::kUInt64:
      return SMDDP_UINT64;
    case at::kBool:
      return SMDDP_UINT8;  // reductions: see to_smddp_reduction
    default:
      break;
  }
  TORCH_CHECK(false, "smddp does not support tensors of dtype ", type,
              reduces ? " in a reduction" : "", "; accepted: ", kAcceptedDtypes);
}

SmddpOp to_smddp_op(const c10d::ReduceOp& rop) {
  switch (rop.op_) {
    case c10d::ReduceOp::SUM:
      return {SMDDP_SUM, 1.0};
    case c10d::ReduceOp::AVG:
      return {SMDDP_AVG, 1.0};
    case c10d::ReduceOp::PRODUCT:
      return {SMDDP_PROD, 1.0};
    case c10d::ReduceOp::MIN:
      return {SMDDP_MIN, 1.0};
    case c10d::ReduceOp::MAX:
      return {SMDDP_MAX, 1.0};
    case c10d::ReduceOp::BAND:
      return {SMDDP_BAND, 1.0};
    case c10d::ReduceOp::BOR:
      return {SMDDP_BOR, 1.0};
    case c10d::ReduceOp::BXOR:
      return {SMDDP_BXOR, 1.0};
    case c10d::ReduceOp::PREMUL_SUM: {
      // NCCLPreMulSumSupplement: the name in torch 2.11, an alias since.
      const auto* sup = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(sup != nullptr,
                  "smddp: PREMUL_SUM without its factor; create it with "
                  "torch.distributed._make_nccl_premul_sum(factor)");
      double factor = sup->double_factor;
      if (sup->tensor_factor.defined()) {
        factor = sup->tensor_factor.to(at::kCPU).item<double>();
      }
      return {SMDDP_PREMUL_SUM, factor};
    }
    default:
      break;
  }
  TORCH_CHECK(false, "smddp does not support ReduceOp ", static_cast<int>(rop.op_),
              "; accepted: SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM, BAND, BOR, BXOR");
}

SmddpReduction to_smddp_reduction(at::ScalarType type, const c10d::ReduceOp& rop) {
  if (type != at::kBool) {
    SmddpOp op = to_smddp_op(rop);
    return {to_smddp_dtype(type, true), op.op, op.factor};
  }
  // A bool is one byte holding 0 or 1: logical reductions are uint8 MAX and MIN.
  switch (rop.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::MAX:
      return {SMDDP_UINT8, SMDDP_MAX, 1.0};
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN:
      return {SMDDP_UINT8, SMDDP_MIN, 1.0};
    case c10d::ReduceOp::BAND:
      return {SMDDP_UINT8, SMDDP_BAND, 1.0};
    case c10d::ReduceOp::BOR:
      return {SMDDP_UINT8, SMDDP_BOR, 1.0};
    case c10d::ReduceOp::BXOR:
      return {SMDDP_UINT8, SMDDP_BXOR, 1.0};
    default:
      break;
  }
  TORCH_CHECK(false, "smddp: ReduceOp ", static_cast<int>(rop.op_), " is not defined on bool "
              "tensors; accepted: SUM and MAX (logical or), PRODUCT and MIN (logical and), "
              "BAND, BOR, BXOR");
}

at::Tensor as_elems(const at::Tensor& t) {
  if (!t.defined()) {
    return t;
  }
  at::ScalarType type = t.scalar_type();
  if (c10::isComplexType(type)) {
    TORCH_CHECK(!t.is_conj(), "smddp: a tensor with its conjugate bit set (a conj() view) is "
                "not accepted; pass t.resolve_conj()");
    return at::view_as_real(t);
  }
  if (c10::isFloat8Type(type)) {
    return t.view(at::kByte);
  }
  return t;
}

std::vector<at::Tensor> as_elems(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) {
    out.push_back(as_elems(t));
  }
  return out;
}

std::vector<std::vector<at::Tensor>> as_elems(const std::vector<std::vector<at::Tensor>>& ts) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(ts.size());
  for (const auto& v : ts) {
    out.push_back(as_elems(v));
  }
  return out;
}

void check_reducible(const at::Tensor& t, const c10d::ReduceOp& rop, const char* fn) {
  if (!t.defined()) {
    return;
  }
  at::ScalarType type = t.scalar_type();
  if (c10::isFloat8Type(type)) {
    TORCH_CHECK(false, "smddp ", fn, ": tensors of dtype ", type, " cannot be reduced (torch "
                "defines no addition for them on the CPU); smddp moves them (broadcast, "
                "allgather, gather, scatter, all-to-all, send/recv)");
  }
  if (c10::isComplexType(type)) {
    TORCH_CHECK(rop.op_ == c10d::ReduceOp::SUM || rop.op_ == c10d::ReduceOp::AVG ||
                    rop.op_ == c10d::ReduceOp::PREMUL_SUM,
                "smddp ", fn, ": ReduceOp ", static_cast<int>(rop.op_), " is not defined on ",
                type, " tensors; accepted: SUM, AVG, PREMUL_SUM (over the real and imaginary "
                "parts)");
  }
}

void check_dtype(const at::Tensor& ref, const at::Tensor& t, const char* fn) {
  if (ref.defined() && t.defined()) {
    TORCH_CHECK(ref.scalar_type() == t.scalar_type(), "smddp ", fn, ": tensors of dtypes ",
                ref.scalar_type(), " and ", t.scalar_type(), " in one call; give one dtype");
  }
}

void check_dtype(const at::Tensor& ref, const std::vector<at::Tensor>& ts, const char* fn) {
  for (const auto& t : ts) {
    check_dtype(ref, t, fn);
  }
}

void check_tensor(const at::Tensor& t, const char* fn) {
  TORCH_CHECK(t.defined(), "smddp ", fn, ": undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided, "smddp ", fn,
              ": only dense (strided) tensors are supported, got layout ", t.layout());
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "smddp ", fn,
              ": tensors on device ", t.device(), " are not supported (cpu, cuda)");
}

void check_alike(const at::Tensor& a, const at::Tensor& b, const char* fn) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "smddp ", fn,
              ": input and output dtypes differ (", a.scalar_type(), " vs ", b.scalar_type(), ")");
  // The memory type and the stream come from one tensor: a CPU input with a
  // CUDA output would have libsmddp write device memory from the host.
  TORCH_CHECK(a.device() == b.device(), "smddp ", fn, ": input and output are on different "
              "devices (", a.device(), " vs ", b.device(), "); put them on one device");
}

smddp_coll_attr_t attr_for(const at::Tensor& t, double factor) {
  smddp_coll_attr_t attr = SMDDP_COLL_ATTR_INIT;
  attr.mem_type = t.is_cuda() ? SMDDP_MEM_CUDA : SMDDP_MEM_HOST;
  if (t.is_cuda()) {
    // The caller's current stream, through the device-generic interface (no
    // link to c10_cuda): libsmddp enqueues the operation on it.
    attr.stream = c10::impl::getDeviceGuardImpl(t.device().type())
                      ->getStream(t.device())
                      .native_handle();
  }
  attr.premul_factor = factor;
  return attr;
}

const char* comm_error(smddp_comm_t comm) {
  const char* msg = smddp_get_last_error(comm);
  return (msg != nullptr && msg[0] != '\0') ? msg : "(no message from libsmddp)";
}

// The error of a call that just failed on this thread.
std::string issue_error(smddp_comm_t comm) {
  const char* msg = smddp_get_last_error(nullptr);
  if (msg != nullptr && msg[0] != '\0') {
    return msg;
  }
  return comm_error(comm);
}

std::string join_sizes(const std::vector<int64_t>& v) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) {
    out << (i ? ", " : "") << v[i];
  }
  out << "]";
  return out.str();
}

std::string op_failure(c10d::OpType type, const c10d::Backend* backend, smddp_comm_t comm,
                       smddp_status_t status) {
  std::ostringstream msg;
  msg << "smddp " << c10d::opTypeToString(type);
  if (backend != nullptr && !backend->getGroupUid().empty()) {
    msg << " on group " << backend->getGroupUid();
    if (!backend->getGroupDesc().empty()) {
      msg << " (" << backend->getGroupDesc() << ")";
    }
  }
  msg << " failed (" << smddp_status_string(status) << "): " << comm_error(comm);
  return msg.str();
}

const char* profiling_title(c10d::OpType type) {
  using c10d::OpType;
  switch (type) {
    case OpType::BROADCAST: return "smddp:broadcast";
    case OpType::ALLREDUCE: return "smddp:all_reduce";
    case OpType::ALLREDUCE_COALESCED: return "smddp:all_reduce_coalesced";
    case OpType::REDUCE: return "smddp:reduce";
    case OpType::ALLGATHER: return "smddp:all_gather";
    case OpType::_ALLGATHER_BASE: return "smddp:_allgather_base";
    case OpType::ALLGATHER_COALESCED: return "smddp:all_gather_coalesced";
    case OpType::GATHER: return "smddp:gather";
    case OpType::SCATTER: return "smddp:scatter";
    case OpType::REDUCE_SCATTER: return "smddp:reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE: return "smddp:_reduce_scatter_base";
    case OpType::ALLTOALL_BASE: return "smddp:all_to_all";
    case OpType::ALLTOALL: return "smddp:all_to_all";
    case OpType::SEND: return "smddp:send";
    case OpType::RECV: return "smddp:recv";
    case OpType::RECVANYSOURCE: return "smddp:recvAnySource";
    case OpType::BARRIER: return "smddp:barrier";
    case OpType::COALESCED: return "smddp:coalesced";
    default: return "smddp:collective";
  }
}

} // namespace detail
} // namespace smddp_torch
