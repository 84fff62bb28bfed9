// Conversions and checks shared by backend.cpp and collectives.cpp.
#pragma once

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "smddp/smddp.h"

namespace c10d {
class Backend;
}  // namespace c10d

namespace smddp_torch {
namespace detail {

extern const char* const kAcceptedDtypes;

// Throws torch.distributed.DistBackendError carrying msg.
[[noreturn]] void throw_backend_error(const std::string& msg);

// libsmddp's dtype for a tensor dtype; raises naming the accepted ones.
smddp_dtype_t to_smddp_dtype(at::ScalarType type, bool reduces);

struct SmddpOp {
  smddp_op_t op;
  double factor;
};

// libsmddp's op (and PREMUL_SUM's factor) for a torch ReduceOp.
SmddpOp to_smddp_op(const c10d::ReduceOp& rop);

struct SmddpReduction {
  smddp_dtype_t dtype;
  smddp_op_t op;
  double factor;
};

// The dtype and op a reduction of `type` runs as: bool reduces as uint8 with
// logical ops (SUM or, PRODUCT and), as gloo does.
SmddpReduction to_smddp_reduction(at::ScalarType type, const c10d::ReduceOp& rop);

// What libsmddp moves or reduces for t, sharing t's memory: a complex tensor
// as its real view (a last dimension of 2: real, imaginary), a float8 one as
// its bytes (uint8); t itself otherwise. The collectives take their tensors
// through it first.
at::Tensor as_elems(const at::Tensor& t);
std::vector<at::Tensor> as_elems(const std::vector<at::Tensor>& ts);
std::vector<std::vector<at::Tensor>> as_elems(const std::vector<std::vector<at::Tensor>>& ts);
// Refuses a reduction that as_elems would turn into another: float8 (torch
// defines no addition on the CPU), and complex with an op other than SUM,
// AVG and PREMUL_SUM (which act on the parts independently).
void check_reducible(const at::Tensor& t, const c10d::ReduceOp& rop, const char* fn);

// Refuses t when its dtype is not ref's; undefined tensors pass. Run on the
// tensors as given, before as_elems, which would hide a complex64 against a
// float32 (..., 2), or one float8 type against another.
void check_dtype(const at::Tensor& ref, const at::Tensor& t, const char* fn);
void check_dtype(const at::Tensor& ref, const std::vector<at::Tensor>& ts, const char* fn);

void check_tensor(const at::Tensor& t, const char* fn);
// The same dtype and the same device.
void check_alike(const at::Tensor& a, const at::Tensor& b, const char* fn);

// Collective attributes for a tensor's memory (host or CUDA).
smddp_coll_attr_t attr_for(const at::Tensor& t, double factor = 1.0);

// The communicator's last error, never empty.
const char* comm_error(smddp_comm_t comm);
// The error of a call that just failed on this thread.
std::string issue_error(smddp_comm_t comm);

std::string join_sizes(const std::vector<int64_t>& v);

// A failed operation's message: "smddp ALLREDUCE on group 0 (default_pg)
// failed (timed out): <libsmddp's message>"; the group's name where backend
// is known and named.
std::string op_failure(c10d::OpType type, const c10d::Backend* backend, smddp_comm_t comm,
                       smddp_status_t status);

// The name torch.profiler shows for a work, as gloo's and NCCL's ("gloo:all_reduce").
const char* profiling_title(c10d::OpType type);

} // namespace detail
} // namespace smddp_torch
