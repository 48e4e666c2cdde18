// The dtype settings membill bills: what each category is stored in, per --dtype and
// --weight-dtype.
#include "cli.h"

#include <stdio.h>

#include <string.h>

// Pure 16-bit runs keep the optimizer state in the parameters' dtype (as torch.optim does);
// mixed precision keeps 16-bit weights, gradients and activations, and a float32 master copy
// with float32 Adam state (DeepSpeed's 2 + 2 + 12 = 16 bytes a parameter). Megatron-LM
// accumulates the gradients in float32 ("main_grad"): 2 + 4 + 12 = 18.
static const cli_dtype dtypes[] = {
    {"fp32", "float32", 32, 32, 32, 32, false, 0, 0, NULL, false},
    {"bf16", "bfloat16", 16, 16, 16, 16, false, 0, 0, NULL, false},
    {"fp16", "float16", 16, 16, 16, 16, false, 0, 0, NULL, false},
    {"bf16-mixed", "bf16-mixed", 16, 16, 16, 32, true, 0, 0, NULL, false},
    {"fp16-mixed", "fp16-mixed", 16, 16, 16, 32, true, 0, 0, NULL, false},
    {"bf16-mixed-fp32-grads", "bf16-mixed-fp32-grads", 16, 16, 32, 32, true, 0, 0, NULL, false},
    // torch.autocast(bfloat16) over a float32 model: float32 parameters, gradients and Adam state;
    // each op's output in the dtype autocast gives it (ag_precision.autocast).
    {"autocast-bf16", "float32 under torch.autocast(bfloat16)", 32, 32, 32, 32, false, 0, 0, NULL, true},
    // The same region over a model cast to bfloat16 (the Trainer's bf16=True over a bf16 checkpoint):
    // the bf16 tensors' products run as they are; float32 ones (PEFT's adapters, their inputs) are
    // cast to bfloat16, a trained weight's cast kept in the cast cache.
    {"bf16-autocast", "bfloat16 under torch.autocast(bfloat16)", 16, 16, 16, 16, false, 0, 0, NULL, true},
};

bool cli_parse_dtype(const char *name, cli_dtype *out) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(name ? name : "fp32", dtypes[i].name) == 0) {
            *out = dtypes[i];
            return true;
        }
    return false;
}

bool cli_parse_weight_dtype(const char *name, long group_size, cli_dtype *d) {
    static const struct {
        const char *name;
        int bits;
    } w[] = {{"fp32", 32}, {"bf16", 16}, {"fp16", 16}, {"int8", 8}, {"int4", 4}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (strcmp(name, w[i].name) == 0) {
            d->weight_bits = w[i].bits;
            d->weight_name = w[i].name;
            d->group = w[i].bits == 4 ? (group_size ? group_size : 32) : 0;
            d->scale_bytes = w[i].bits == 4 ? 2 : 0;
            return true;
        }
    return false;
}

bool cli_dtype_is_f32(const cli_dtype *d) {
    return !d->name || (d->act_bits == 32 && d->weight_bits == 32 && d->grad_bits == 32 && d->state_bits == 32 &&
                        !d->master && !d->autocast);
}

ag_precision cli_precision(const cli_dtype *d) {
    if (!d->name) return ag_precision_f32();
    return (ag_precision){.act_bits = d->act_bits,
                          .weight_bits = d->weight_bits,
                          .grad_bits = d->grad_bits,
                          .group = d->group,
                          .scale_bytes = d->scale_bytes,
                          .autocast = d->autocast,
                          .fp16 = strncmp(d->name, "fp16", 4) == 0};
}

void cli_dtype_optim(const cli_dtype *d, optim_config *c) {
    c->state_bits = d->name ? d->state_bits : 32;
    c->state_fp16 = d->name && strncmp(d->name, "fp16", 4) == 0;
    c->master = d->name && d->master;
}

const char *cli_dtype_bytes_text(const cli_dtype *d, optim_kind kind, char *buf, size_t len) {
    cli_dtype f;
    if (!d->name) cli_parse_dtype(NULL, &f), d = &f;
    int states = (int)(optim_state_bytes_per_element(kind) / sizeof(float)), n;
    n = snprintf(buf, len, "%d + %d", d->weight_bits / 8, d->grad_bits / 8);
    if (d->master && kind != OPTIM_NONE) n += snprintf(buf + n, len - (size_t)n, " + 4");
    for (int i = 0; i < states && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, " + %d", d->state_bits / 8);
    return buf;
}

bool cli_parse_framework(const char *name, ag_framework *out) {
    if (!name) name = AG_FW(ag_framework_row_of(CLI_DEFAULT_FRAMEWORK), name);
    for (int f = 0; f < AG_NFRAMEWORKS; f++)
        if (strcmp(name, AG_FW(ag_framework_row_of((ag_framework)f), name)) == 0) {
            *out = (ag_framework)f;
            return true;
        }
    return false;
}

const char *cli_framework_name(ag_framework f) {
    const ag_framework_row *r = ag_framework_row_of(f);
    return r ? AG_FW(r, name) : "?";
}

const char *cli_framework_text(ag_framework f, llama_family family, char *buf, size_t len) {
    const ag_framework_row *r = ag_framework_row_of(f);
    const char *text = r ? AG_FW(r, text) : "?", *at = strstr(text, "LlamaForCausalLM");
    if (!at) return snprintf(buf, len, "%s", text), buf; // the row names no class
    snprintf(buf, len, "%.*s%s%s", (int)(at - text), text, llama_family_class(family), at + strlen("LlamaForCausalLM"));
    return buf;
}

// The default first, then the others in the rows' order.
static ag_framework nth_framework(int i) { return (ag_framework)((CLI_DEFAULT_FRAMEWORK + i) % AG_NFRAMEWORKS); }

const char *cli_framework_choices(void) {
    static char list[128];
    size_t n = 0;
    for (int i = 0; i < AG_NFRAMEWORKS && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? "|" : "", cli_framework_name(nth_framework(i)));
    return list;
}

const char *cli_framework_help(void) {
    static char help[512];
    size_t n = (size_t)snprintf(help, sizeof help, "memory semantics: ");
    for (int i = 0; i < AG_NFRAMEWORKS && n < sizeof help; i++) {
        const ag_framework_row *r = ag_framework_row_of(nth_framework(i));
        n += (size_t)snprintf(help + n, sizeof help - n, "%s%s (%s)", i ? ", " : "", AG_FW(r, name), AG_FW(r, brief));
    }
    return help;
}

// One field of the table: its name, what it decides, each row's value ("the same" where it
// repeats the row before), as a Markdown table row or as text.
static void field_line(FILE *f, ag_framework_field field, const ag_framework_row *const rows[], int n, bool markdown) {
    if (markdown)
        fprintf(f, "| `%s` | %s |", ag_framework_field_name(field), ag_framework_field_doc(field));
    else
        fprintf(f, "\n%s: %s\n", ag_framework_field_name(field), ag_framework_field_doc(field));
    const char *above = NULL;
    for (int i = 0; i < n; i++) {
        const char *v = ag_framework_field_value(rows[i], field), *shown = above && !strcmp(above, v) ? "the same" : v;
        if (markdown)
            fprintf(f, " %s |", shown);
        else
            fprintf(f, "  %-14s %s\n", ag_framework_field_value(rows[i], AG_FWF_name), shown);
        above = v;
    }
    if (markdown) fputc('\n', f);
}

void cli_frameworks_table(FILE *f, const ag_framework_row *const rows[], int n, bool markdown) {
    if (markdown) {
        fputs("| field | decides |", f);
        for (int i = 0; i < n; i++) fprintf(f, " `%s` |", ag_framework_field_value(rows[i], AG_FWF_name));
        fputs("\n|---|---|", f);
        for (int i = 0; i < n; i++) fputs("---|", f);
        fputc('\n', f);
    } else {
        fputs("What each framework allocates, keeps and frees (--framework NAME): the rows of autograd's table, one\n"
              "field a decision. A value equal to the row above reads \"the same\".\n",
              f);
    }
    for (int k = 0; k < AG_FW_NFIELDS; k++)
        if (k != AG_FWF_name) field_line(f, (ag_framework_field)k, rows, n, markdown); // the rows' own labels
}

void cli_frameworks_help(FILE *f, bool markdown) {
    const ag_framework_row *rows[AG_NFRAMEWORKS];
    for (int i = 0; i < AG_NFRAMEWORKS; i++) rows[i] = ag_framework_row_of(nth_framework(i));
    cli_frameworks_table(f, rows, AG_NFRAMEWORKS, markdown);
    if (!markdown) cli_devices_help(f);
}

// The devices (--device NAME) and the SDPA kernels each --attention names there: autograd's
// second table, a row a kernel.
void cli_devices_help(FILE *f) {
    fputs("\nWhich kernel each fused --attention is, by --device (the pytorch frameworks; lean's is its own):\n", f);
    for (int d = 0; d < AG_NDEVICES; d++) {
        const ag_device_row *r = ag_device_row_of((ag_device)d);
        fprintf(f, "  %s: torch.optim's default Adam %s\n", r->text, r->adam_foreach ? "foreach" : "for-loop");
        for (int a = AG_ATTENTION_FLASH; a < AG_NATTENTION; a++)
            fprintf(f, "    --attention %-9s %s\n", cli_attention_name((ag_attention_kind)a),
                    r->sdpa[a] ? AG_SDPA(r->sdpa[a], name) : "(none on this device)");
    }
    const ag_sdpa_kernel *k[16];
    int n = ag_sdpa_kernels(k, 16);
    fputs("\nWhat each kernel allocates and keeps (its row):\n", f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "  %s: %s\n", AG_SDPA(k[i], name), AG_SDPA(k[i], source));
        fprintf(f,
                "    out_heads_first %d, lse_align %d, rng_bytes %d, gqa %d, d_rows_align %d, dq_accum %s, "
                "dq_dim_align %d, dkv_expanded %d\n",
                AG_SDPA(k[i], out_heads_first), AG_SDPA(k[i], lse_align), AG_SDPA(k[i], rng_bytes), AG_SDPA(k[i], gqa),
                AG_SDPA(k[i], d_rows_align), AG_SDPA(k[i], dq_accum) == AG_DQ_ALWAYS ? "always" : "16-bit",
                AG_SDPA(k[i], dq_dim_align), AG_SDPA(k[i], dkv_expanded));
    }
    fputs("  (fields:", f);
    for (int i = AG_SDPAF_out_heads_first; i < AG_SDPA_NFIELDS; i++)
        fprintf(f, "%s %s: %s", i > AG_SDPAF_out_heads_first ? ";" : "", ag_sdpa_field_name((ag_sdpa_field)i),
                ag_sdpa_field_doc((ag_sdpa_field)i));
    fputs(")\n", f);
}

static const char *const attention_names[AG_NATTENTION] = {"eager", "flash", "efficient", "cudnn"};

bool cli_parse_attention(const char *name, ag_attention_kind *out) {
    for (int a = 0; a < AG_NATTENTION; a++)
        if (!name ? a == AG_ATTENTION_EAGER : strcmp(name, attention_names[a]) == 0) {
            *out = (ag_attention_kind)a;
            return true;
        }
    return false;
}

const char *cli_attention_name(ag_attention_kind a) {
    return (unsigned)a < AG_NATTENTION ? attention_names[a] : attention_names[0];
}

ag_device cli_device_kind(const cli_options *o) {
    return (o->device && strcmp(o->device, "cuda") == 0) || o->gpu ? AG_DEVICE_CUDA : AG_DEVICE_CPU;
}

const char *cli_attention_text(ag_attention_kind a) {
    static const char *const texts[AG_NATTENTION] = {
        "eager (the probabilities materialised)", "flash (no T x T tensor: log-sum-exp rows kept)",
        "efficient (PyTorch's memory-efficient kernel: log-sum-exp rows padded to 32, no grouped heads)",
        "cudnn (cuDNN's kernel: log-sum-exp rows and its RNG seed and offset kept)"};
    return (unsigned)a < AG_NATTENTION ? texts[a] : texts[0];
}
