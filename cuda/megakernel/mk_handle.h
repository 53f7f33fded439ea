// The megakernel handle behind the C API (host only), shared by mk_api.cu and mk_io.cu.
#pragma once

#include <vector>

#include "lucebox.h"
#include "mk_launch.h"

namespace mk {

inline bool is_attn_layer(int l) { return (l + 1) % 4 == 0; }

struct Handle {
    lb_mk_config_t cfg{};
    lb_mk_info_t info{};
    std::vector<Layer> layers;
    Layer* d_layers = nullptr;
    uint16_t* wblob = nullptr;
    float* fblob = nullptr;
    uint8_t* sblob = nullptr;
    float* out_norm = nullptr;
    float* scratch = nullptr;  // h, y_in, o_buf, gu, attn_part, am_val, logits
    int* iscratch = nullptr;   // am_idx, bar, last_token, forced
    int* host_tokens = nullptr;
    Params P{};
    cudaStream_t stream = nullptr;
    cudaEvent_t ev0 = nullptr, ev1 = nullptr;
    int pos = 0;
    int pending = -1;
    int running = 0;  // steps of the launch in flight (0: none)
    int want_logits = 0;
    size_t state_bytes = 0;
    int slot_bytes = 0;  // bytes per per-warp weight-ring slot (info.nslots = slots per warp)
};

}  // namespace mk
