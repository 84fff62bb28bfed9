// Hands a torch c10d::Store to libsmddp through the C store table.
#pragma once

#include <smddp/smddp.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace smddp_torch {

// Fills *out with callbacks that forward to store. The table owns a new
// reference to the store; libsmddp drops it through out->release when the last
// communicator created from the table is destroyed. No C++ exception escapes a
// callback: each is translated into SMDDP_ERR_STORE or SMDDP_ERR_TIMEOUT with
// its text passed to smddp_set_store_error(). libsmddp also calls release when
// smddp_comm_create() fails after taking the table, so the caller never frees
// the context itself (at worst, a create rejected before it looked at the table
// leaks one small context).
void store_bridge_init(const c10::intrusive_ptr<c10d::Store>& store, smddp_store_t* out);

} // namespace smddp_torch
