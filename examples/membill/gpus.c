// Named GPUs: the memory PyTorch sees on each (torch.cuda.get_device_properties(0).total_memory,
// which is the CUDA driver's cudaDeviceProp.totalGlobalMem: less than the card's nominal size and
// less than nvidia-smi's total), and the CUDA context a PyTorch process holds there besides its
// allocator. Every figure says where it comes from: a public report (named), or an estimate (how).
#include "cli.h"

#include <string.h>

#define GIB 1073741824.0
#define MIB 1048576ULL

// A figure read as "X.YZ GiB" in a PyTorch out-of-memory message ("GPU 0 has a total capacity
// of X.YZ GiB"): that rounding leaves it within 5.4 MB.
#define GIB_2(x) ((uint64_t)((x) * GIB))

// The context: cudaMemGetInfo's used memory once PyTorch's first kernel ran, with lazy module
// loading (CUDA >= 11.7, PyTorch's default). Kernels loaded later (cuBLAS, attention) add to it.
#define CONTEXT_LAZY (400 * 1000 * 1000ULL)
#define CONTEXT_LAZY_SOURCE                                                                                            \
    "public report: \"around 400MB if CUDA >= 11.7 is used and lazy module loading enabled\" (pytorch/pytorch#109888)"

static const cli_gpu gpus[] = {
    {"a100-40gb", "NVIDIA A100-SXM4-40GB", 42298834944ULL,
     "public report: deviceQuery, 42298834944 bytes (bottlerocket-os/bottlerocket#3873)", CONTEXT_LAZY,
     CONTEXT_LAZY_SOURCE, true, false},
    {"a100-80gb", "NVIDIA A100 80GB", GIB_2(79.25),
     "public report: PyTorch's OOM message on an A100 80GB, 79.25 GiB total capacity (levihsu/OOTDiffusion#235)",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, true, false},
    {"h100-80gb", "NVIDIA H100 80GB HBM3", GIB_2(79.11),
     "public report: PyTorch's OOM message on an H100, 79.11 GiB total capacity (vllm-project/vllm#27508)",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, true, true},
    {"h100-nvl", "NVIDIA H100 NVL", GIB_2(93.00),
     "public report: PyTorch's OOM message on an H100 NVL 94GB, 93.00 GiB total capacity (ali-vilab/VACE#56)",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, true, true},
    {"h200", "NVIDIA H200", 140ULL * 1024 * MIB - 550 * MIB,
     "estimate: 140 GiB of HBM3e less the 550 MiB the driver keeps on an H100 80GB (nvidia-smi 81559 MiB, "
     "modal-labs/modal-client#2797, against PyTorch's 79.11 GiB)",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, false, true},
    {"h20", "NVIDIA H20", 96ULL * 1024 * MIB - 550 * MIB,
     "estimate: 96 GiB of HBM3 less the 550 MiB the driver keeps on an H100 80GB (as h200)", CONTEXT_LAZY,
     CONTEXT_LAZY_SOURCE, false, true},
    {"l4", "NVIDIA L4", 23034 * MIB - 550 * MIB,
     "estimate: nvidia-smi's 23034 MiB (modal-labs/modal-client#2797) less the 550 MiB the driver keeps on an H100 80GB",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, false, false},
    {"l40s", "NVIDIA L40S", 46068 * MIB - 550 * MIB,
     "estimate: nvidia-smi's 46068 MiB (modal-labs/modal-client#2797) less the 550 MiB the driver keeps on an H100 80GB",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, false, false},
    {"rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", 50865307648ULL,
     "public report: torch.cuda.get_device_properties and mem_get_info, 50,865,307,648 bytes "
     "(unslothai/unsloth-zoo#1053)",
     426 * MIB, "public report: nvidia-smi shows 426 MiB once mem_get_info made the context (unslothai/unsloth-zoo#1053)",
     true, false},
    {"rtx-3090", "NVIDIA GeForce RTX 3090", GIB_2(23.70),
     "public report: PyTorch's OOM message on 8 x RTX 3090, 23.70 GiB total capacity (yandex/YaLM-100B#9)",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, true, false},
    {"rtx-4090", "NVIDIA GeForce RTX 4090", GIB_2(23.68),
     "public report: PyTorch's OOM message on an RTX 4090, 23.68 GiB total capacity (zai-org/CogVideo#36)",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, true, false},
    {"rtx-5090", "NVIDIA GeForce RTX 5090", 33677180928ULL,
     "public report: deviceQuery, 33677180928 bytes (aikitoria/open-gpu-kernel-modules#1)", CONTEXT_LAZY,
     CONTEXT_LAZY_SOURCE, true, false},
    {"t4", "Tesla T4", GIB_2(14.75),
     "public report: PyTorch's OOM message on Colab's T4, 14.75 GiB total capacity (hpcaitech/Open-Sora#697)",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, true, false},
    {"v100-32gb", "Tesla V100-SXM2-32GB", GIB_2(31.74),
     "public report: PyTorch's OOM message on a V100 32GB, 31.74 GiB total capacity (liucongg/ChatGLM-Finetuning#73)",
     CONTEXT_LAZY, CONTEXT_LAZY_SOURCE, true, false},
    {"mi300x", "AMD Instinct MI300X", 192ULL * 1024 * MIB - 550 * MIB,
     "estimate: 192 GiB of HBM3 less 550 MiB as on NVIDIA's cards (ROCm's HIP allocator follows the same caching "
     "rules)",
     CONTEXT_LAZY, "estimate: as NVIDIA's lazy-loading context (pytorch/pytorch#109888); ROCm's is not reported", false, false},
};

size_t cli_gpu_count(void) { return sizeof gpus / sizeof gpus[0]; }

const cli_gpu *cli_gpu_at(size_t i) { return i < cli_gpu_count() ? &gpus[i] : NULL; }

const cli_gpu *cli_gpu_find(const char *name) {
    for (size_t i = 0; name && i < cli_gpu_count(); i++)
        if (strcmp(gpus[i].name, name) == 0) return &gpus[i];
    return NULL;
}

// "a100-40gb, a100-80gb, ..." for a usage error.
const char *cli_gpu_names(char *buf, size_t len) {
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < cli_gpu_count(); i++)
        n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", i ? ", " : "", gpus[i].name);
    return buf;
}

void cli_gpu_list(FILE *f) {
    char a[64], b[64];
    fprintf(f, "%-14s %-32s %-34s %s\n", "gpu", "device", "total_memory (PyTorch)", "CUDA context");
    for (size_t i = 0; i < cli_gpu_count(); i++) {
        const cli_gpu *g = &gpus[i];
        fprintf(f, "%-14s %-32s %-34s %s\n", g->name, g->product, mp_format_bytes(a, sizeof a, g->total_bytes),
                mp_format_bytes(b, sizeof b, g->context_bytes));
        fprintf(f, "    total: %s%s\n    context: %s\n", g->total_source, g->total_reported ? "" : " (no measured figure found)",
                g->context_source);
    }
}
