// smddp._C: creates the "smddp" backend for torch.distributed. The Python
// package registers it (smddp/__init__.py); this module only builds it.
#include <smddp/smddp.h>

#include <torch/csrc/utils/pybind.h>

#include "backend.hpp"

#ifndef SMDDP_TORCH_VERSION
#error "SMDDP_TORCH_VERSION (torch.__version__ at build time) must be defined"
#endif

namespace py = pybind11;

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
        auto* pg = dynamic_cast<smddp_torch::ProcessGroupSMDDP*>(backend.get());
        TORCH_CHECK(pg != nullptr, "smddp.dump_trace: the group's CPU backend is ",
                    backend ? backend->getBackendName() : std::string("none"),
                    ", not smddp");
        return pg->dump_trace(path);
      },
      py::arg("backend"), py::arg("path"),
      "Writes the flight recorder of an smddp backend's communicator to path.",
      py::call_guard<py::gil_scoped_release>());
}
