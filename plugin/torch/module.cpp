// smddp._C: creates the "smddp" backend for torch.distributed. The Python
// package registers it (smddp/__init__.py); this module only builds it.
#include <smddp/smddp.h>

#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include "backend.hpp"

#ifndef SMDDP_TORCH_VERSION
#error "SMDDP_TORCH_VERSION (torch.__version__ at build time) must be defined"
#endif

namespace py = pybind11;

namespace {

// backend as smddp's: itself, or the smddp backend that torch's
// ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) wraps, found through
// the options the wrapper forwards (torch's wheel lacks the gloo headers
// that ProcessGroupWrapper.hpp needs); nullptr for any other backend. The
// result lives as long as backend does.
smddp_torch::ProcessGroupSMDDP* find_smddp(const c10::intrusive_ptr<c10d::Backend>& backend) {
  if (auto* pg = dynamic_cast<smddp_torch::ProcessGroupSMDDP*>(backend.get())) {
    return pg;
  }
  // A wrapper names the backend it wraps; only then are its options asked
  // for (other backends may not implement getBackendOptions).
  if (!backend || backend->getBackendName() != "smddp") {
    return nullptr;
  }
  try {
    auto opts = backend->getBackendOptions();
    auto* own = dynamic_cast<smddp_torch::SMDDPOptions*>(opts.get());
    // The wrapper holds the backend, so it outlives this call's result.
    auto inner = own ? own->backend.lock() : c10::intrusive_ptr<c10d::Backend>();
    return dynamic_cast<smddp_torch::ProcessGroupSMDDP*>(inner.get());
  } catch (const c10::Error&) {
    return nullptr;  // a wrapper that does not forward the options
  }
}

// backend as smddp's, for smddp.<fn>; throws naming what it is otherwise.
smddp_torch::ProcessGroupSMDDP* smddp_backend(const c10::intrusive_ptr<c10d::Backend>& backend,
                                              const char* fn) {
  auto* pg = find_smddp(backend);
  TORCH_CHECK(pg != nullptr, "smddp.", fn, ": the group's backend for this device is ",
              backend ? backend->getBackendName() : std::string("none"),
              ", not smddp (or a wrapper of smddp's that does not forward its options)");
  return pg;
}

// group's smddp backend for tensors on t's device, for smddp.<fn>.
smddp_torch::ProcessGroupSMDDP* smddp_backend_for(
    const c10::intrusive_ptr<c10d::ProcessGroup>& group, const at::Tensor& t, const char* fn) {
  TORCH_CHECK(group, "smddp.", fn, ": no process group given");
  return smddp_backend(group->getBackend(t.device().type()), fn);
}

// The reduce op of torch's functional collectives' names ("sum", "avg",
// "product", "min", "max", "band", "bor", "bxor").
c10d::ReduceOp op_named(const std::string& name) {
  static const std::pair<const char*, c10d::ReduceOp::RedOpType> ops[] = {
      {"sum", c10d::ReduceOp::SUM},   {"avg", c10d::ReduceOp::AVG},
      {"product", c10d::ReduceOp::PRODUCT}, {"min", c10d::ReduceOp::MIN},
      {"max", c10d::ReduceOp::MAX},   {"band", c10d::ReduceOp::BAND},
      {"bor", c10d::ReduceOp::BOR},   {"bxor", c10d::ReduceOp::BXOR}};
  for (const auto& [n, op] : ops) {
    if (name == n) {
      return c10d::ReduceOp(op);
    }
  }
  TORCH_CHECK(false, "smddp::all_reduce_: reduce op '", name, "' is not one of sum, avg, "
              "product, min, max, band, bor, bxor");
}

// torch.ops.smddp.all_reduce_ and all_gather_into_tensor_out: smddp.all_reduce
// and smddp.all_gather_into_tensor as operators, so that torch.compile traces
// them (the group by its registered name, as functional collectives take it).
// They write their tensor argument and return nothing, which functionalization
// (torch.compile) takes for a custom operator.
void all_reduce_op(at::Tensor tensor, std::string reduce_op, std::string group_name) {
  auto group = c10d::resolve_process_group(group_name);
  smddp_backend_for(group, tensor, "all_reduce")->allreduce_now(tensor, op_named(reduce_op));
}

void all_gather_op(at::Tensor input, std::string group_name, at::Tensor out) {
  auto group = c10d::resolve_process_group(group_name);
  smddp_backend_for(group, input, "all_gather_into_tensor")->allgather_now(out, input);
}

// Under torch.compile's fake tensors: nothing to compute.
void all_reduce_meta(at::Tensor, std::string, std::string) {}

void all_gather_meta(at::Tensor, std::string, at::Tensor) {}

}  // namespace

TORCH_LIBRARY(smddp, m) {
  m.def("all_reduce_(Tensor(a!) tensor, str reduce_op, str group_name) -> ()");
  m.def("all_gather_into_tensor_out(Tensor input, str group_name, *, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(smddp, CPU, m) {
  m.impl("all_reduce_", all_reduce_op);
  m.impl("all_gather_into_tensor_out", all_gather_op);
}

TORCH_LIBRARY_IMPL(smddp, CUDA, m) {
  m.impl("all_reduce_", all_reduce_op);
  m.impl("all_gather_into_tensor_out", all_gather_op);
}

TORCH_LIBRARY_IMPL(smddp, Meta, m) {
  m.impl("all_reduce_", all_reduce_meta);
  m.impl("all_gather_into_tensor_out", all_gather_meta);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "libsmddp's torch.distributed backend (C++ shim)";
  // The Python package compares this with torch.__version__ at import.
  m.attr("torch_version") = SMDDP_TORCH_VERSION;
  m.attr("smddp_version") = smddp_get_version();
  // torch must have registered c10d.Backend before we return one.
  py::module_::import("torch.distributed");
  m.def("create_backend", &smddp_torch::create_backend, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout_ms"), py::arg("name") = std::string(),
        "Creates the smddp backend for one group (collective over its ranks).",
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "dump_trace",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& path) {
        auto* pg = smddp_backend(backend, "dump_trace");
        return pg->dump_trace(path);
      },
      py::arg("backend"), py::arg("path"),
      "Writes the flight recorder of an smddp backend's communicator to path.",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "stats",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* pg = smddp_backend(backend, "stats");
        std::vector<int64_t> late;
        smddp_comm_stats_t st;
        {
          py::gil_scoped_release nogil;
          st = pg->stats(late);
        }
        py::list late_s;
        for (int64_t ns : late) {
          if (ns < 0)
            late_s.append(py::none());
          else
            late_s.append(static_cast<double>(ns) / 1e9);
        }
        py::dict skew;
        skew["p50"] = static_cast<double>(st.skew_p50_ns) / 1e3;
        skew["p99"] = static_cast<double>(st.skew_p99_ns) / 1e3;
        skew["max"] = static_cast<double>(st.skew_max_ns) / 1e3;
        skew["mean"] = st.ops ? static_cast<double>(st.skew_sum_ns) / 1e3 /
                                    static_cast<double>(st.ops)
                              : 0.0;
        py::dict out;
        out["ops"] = st.ops;
        out["late_s"] = late_s;
        out["slowest_rank"] = st.slowest_rank >= 0 ? py::object(py::int_(st.slowest_rank))
                                                   : py::object(py::none());
        out["skew_us"] = skew;
        out["clock_error_us"] = static_cast<double>(st.clock_error_ns) / 1e3;
        out["ranks_covered"] = st.ranks_covered;
        return out;
      },
      py::arg("backend"),
      "The straggler telemetry of an smddp backend's communicator, as a dict.");
  // smddp.all_reduce: the reduce op as torch's ReduceOp.SUM etc. (a
  // RedOpType, taken without pybind11's implicit conversion), or a ReduceOp.
  m.def(
      "all_reduce",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor& tensor,
         c10d::ReduceOp::RedOpType op) {
        smddp_backend_for(group, tensor, "all_reduce")->allreduce_now(tensor, c10d::ReduceOp(op));
      },
      py::arg("group"), py::arg("tensor"), py::arg("op"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "all_reduce",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor& tensor,
         const c10d::ReduceOp& op) {
        smddp_backend_for(group, tensor, "all_reduce")->allreduce_now(tensor, op);
      },
      py::arg("group"), py::arg("tensor"), py::arg("op"),
      "Allreduce of tensor in place over group, finished when it returns.",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "all_gather_into_tensor",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor& output,
         at::Tensor& input) {
        smddp_backend_for(group, input, "all_gather_into_tensor")->allgather_now(output, input);
      },
      py::arg("group"), py::arg("output"), py::arg("input"),
      "Allgather of input into output (world size x input) over group, finished when it returns.",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "move_to_pool",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, const at::Tensor& tensor) {
        TORCH_CHECK(group, "smddp.move_to_pool: no process group given");
        if (!tensor.defined() || !group->hasBackendForDeviceType(tensor.device().type())) {
          return false;
        }
        auto* pg = find_smddp(group->getBackend(tensor.device().type()));
        return pg != nullptr && pg->move_to_pool(tensor);
      },
      py::arg("group"), py::arg("tensor"),
      "Moves tensor's storage into the pool of group's smddp backend; whether it lies in one.",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "abort_work", [](const c10::intrusive_ptr<c10d::Work>& work) { work->abort(); },
      py::arg("work"), "Calls Work::abort() of a torch.distributed Work.",
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "peer_states",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* pg = smddp_backend(backend, "peer_states");
        std::vector<std::string> out;
        for (smddp_peer_state_t s : pg->peer_states()) {
          out.emplace_back(s == SMDDP_PEER_ALIVE  ? "alive"
                           : s == SMDDP_PEER_GONE ? "gone"
                           : s == SMDDP_PEER_LEFT ? "left"
                                                  : "unknown");
        }
        return out;
      },
      py::arg("backend"), "What this rank knows of each rank of the group, in rank order.",
      py::call_guard<py::gil_scoped_release>());
}
