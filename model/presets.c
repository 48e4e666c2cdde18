// Built-in configs, copied from the models' Hugging Face config.json files. Each one's
// parameter count is checked against the published figure in tests/model/test_config.c.
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "model.h"

typedef struct {
    const char *name;
    int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_positions;
    double rope_theta, rms_eps;
    bool tied;
    llama_family family;
    int64_t sliding_window; // every layer's (Mistral-7B-v0.1's config.json: 4096)
} preset;

static const preset presets[] = {
    // name             hidden inter  layers heads kv  hdim vocab   positions theta  eps  tied
    {"smollm2-135m", 576, 1536, 30, 9, 3, 64, 49152, 8192, 100000.0, 1e-5, true, LLAMA_FAMILY_LLAMA, 0},
    {"smollm2-360m", 960, 2560, 32, 15, 5, 64, 49152, 8192, 100000.0, 1e-5, true, LLAMA_FAMILY_LLAMA, 0},
    {"smollm2-1.7b", 2048, 8192, 24, 32, 32, 64, 49152, 8192, 130000.0, 1e-5, true, LLAMA_FAMILY_LLAMA, 0},
    {"llama-2-7b", 4096, 11008, 32, 32, 32, 128, 32000, 4096, 10000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-2-13b", 5120, 13824, 40, 40, 40, 128, 32000, 4096, 10000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    // LLaMA (1) 65B: the model the QLoRA paper fine-tunes on one 48 GB GPU
    {"llama-65b", 8192, 22016, 80, 64, 64, 128, 32000, 2048, 10000.0, 1e-6, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-2-70b", 8192, 28672, 80, 64, 8, 128, 32000, 4096, 10000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-3-8b", 4096, 14336, 32, 32, 8, 128, 128256, 8192, 500000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-3-70b", 8192, 28672, 80, 64, 8, 128, 128256, 8192, 500000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"llama-3.1-405b", 16384, 53248, 126, 128, 8, 128, 128256, 131072, 500000.0, 1e-5, false, LLAMA_FAMILY_LLAMA, 0},
    {"mistral-7b", 4096, 14336, 32, 32, 8, 128, 32000, 32768, 10000.0, 1e-5, false, LLAMA_FAMILY_MISTRAL, 4096},
};

#define NPRESETS (sizeof presets / sizeof presets[0])

size_t llama_preset_count(void) { return NPRESETS; }

const char *llama_preset_name(size_t i) { return i < NPRESETS ? presets[i].name : NULL; }

static void list_names(char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NPRESETS && used < len; i++) {
        int k = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", presets[i].name);
        if (k < 0) break;
        used += (size_t)k;
    }
}

int llama_config_preset(llama_config *out, const char *name, ag_err *err) {
    for (size_t i = 0; name && i < NPRESETS; i++) {
        const preset *p = &presets[i];
        if (strcasecmp(p->name, name) != 0) continue;
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "%s", p->name);
        out->hidden = p->hidden;
        out->intermediate = p->intermediate;
        out->layers = p->layers;
        out->heads = p->heads;
        out->kv_heads = p->kv_heads;
        out->head_dim = p->head_dim;
        out->vocab = p->vocab;
        out->max_positions = p->max_positions;
        out->rope_theta = p->rope_theta;
        out->rms_eps = p->rms_eps;
        out->tied = p->tied;
        out->family = p->family;
        out->sliding_window = p->sliding_window;
        return 0;
    }
    char known[384];
    list_names(known, sizeof known);
    ag_err_set(err, "unknown model '%s' (presets: %s)", name ? name : "(null)", known);
    return -1;
}
