#include "store_bridge.hpp"

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

namespace smddp_torch {
namespace {

struct StoreContext {
  c10::intrusive_ptr<c10d::Store> store;
};

c10d::Store& store_of(void* ctx) {
  return *static_cast<StoreContext*>(ctx)->store;
}

bool looks_like_timeout(const char* what) {
  std::string text(what);
  for (auto& ch : text) {
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  return text.find("timeout") != std::string::npos ||
      text.find("timed out") != std::string::npos;
}

// Runs body and turns any exception into a status with a store error message.
template <typename Body>
smddp_status_t guarded(const char* what, const char* key, Body&& body) noexcept {
  try {
    body();
    return SMDDP_OK;
  } catch (const std::exception& e) {
    std::string msg = std::string("torch store ") + what + "('" + key + "'): " + e.what();
    smddp_set_store_error(msg.c_str());
    return looks_like_timeout(e.what()) ? SMDDP_ERR_TIMEOUT : SMDDP_ERR_STORE;
  } catch (...) {
    std::string msg = std::string("torch store ") + what + "('" + key + "'): unknown C++ exception";
    smddp_set_store_error(msg.c_str());
    return SMDDP_ERR_STORE;
  }
}

smddp_status_t bridge_set(void* ctx, const char* key, const void* value, size_t len) {
  return guarded("set", key, [&] {
    const auto* bytes = static_cast<const uint8_t*>(value);
    store_of(ctx).set(key, std::vector<uint8_t>(bytes, bytes + len));
  });
}

smddp_status_t bridge_get(void* ctx, const char* key, int64_t timeout_ms, void** value,
                          size_t* len) {
  std::vector<uint8_t> data;
  smddp_status_t st = guarded("get", key, [&] {
    auto& store = store_of(ctx);
    if (timeout_ms >= 0) {
      store.wait({key}, std::chrono::milliseconds(timeout_ms));
    } else {
      store.wait({key});
    }
    data = store.get(key);
  });
  if (st != SMDDP_OK) {
    return st;
  }
  // malloc(0) may return NULL; always hand back a freeable, non-NULL pointer.
  void* copy = std::malloc(data.empty() ? 1 : data.size());
  if (copy == nullptr) {
    smddp_set_store_error("torch store get: out of memory copying the value");
    return SMDDP_ERR_NO_MEMORY;
  }
  if (!data.empty()) {
    std::memcpy(copy, data.data(), data.size());
  }
  *value = copy;
  *len = data.size();
  return SMDDP_OK;
}

smddp_status_t bridge_add(void* ctx, const char* key, int64_t delta, int64_t* result) {
  return guarded("add", key, [&] { *result = store_of(ctx).add(key, delta); });
}

void bridge_release(void* ctx) {
  delete static_cast<StoreContext*>(ctx);
}

} // namespace

void store_bridge_init(const c10::intrusive_ptr<c10d::Store>& store, smddp_store_t* out) {
  std::memset(out, 0, sizeof(*out));
  out->size = sizeof(smddp_store_t);
  out->ctx = new StoreContext{store};
  out->set = bridge_set;
  out->get = bridge_get;
  out->add = bridge_add;
  out->release = bridge_release;
}

} // namespace smddp_torch
