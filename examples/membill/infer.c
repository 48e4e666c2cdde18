// membill infer: prefill and greedy decode with a KV cache, billed like training.
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

// --tokens "1,2;3,4,5": one prompt per ';', left-padded with id 0 to the longest.
static int parse_prompts(const char *text, infer_run *r, ag_err *err) {
    long rows = 1, longest = 0;
    for (const char *p = text; *p; p++) rows += *p == ';';
    int32_t **ids = calloc((size_t)rows, sizeof *ids);
    long *len = calloc((size_t)rows, sizeof *len);
    int rc = ids && len ? 0 : EXIT_RUN_FAILED;
    const char *start = text;
    for (long i = 0; rc == 0 && i < rows; i++) {
        const char *end = strchr(start, ';');
        size_t n = end ? (size_t)(end - start) : strlen(start);
        char *row = strndup(start, n);
        rc = row ? cli_parse_tokens(row, r->cfg.vocab, &ids[i], &len[i], err) : EXIT_RUN_FAILED;
        free(row);
        if (rc == 0 && len[i] > longest) longest = len[i];
        start = end ? end + 1 : start + n;
    }
    if (rc == 0) {
        r->batch = rows;
        r->seq_len = longest;
        r->ids = calloc((size_t)(rows * longest), sizeof *r->ids);
        r->mask = calloc((size_t)(rows * longest), sizeof *r->mask);
        rc = r->ids && r->mask ? 0 : EXIT_RUN_FAILED;
        for (long i = 0; rc == 0 && i < rows; i++)
            for (long t = 0; t < len[i]; t++) {
                r->ids[i * longest + longest - len[i] + t] = ids[i][t];
                r->mask[i * longest + longest - len[i] + t] = 1;
            }
    }
    if (rc != 0 && !err->msg[0]) ag_err_set(err, "--tokens: out of memory");
    for (long i = 0; ids && i < rows; i++) free(ids[i]);
    free(ids);
    free(len);
    return rc;
}

int cli_infer_prepare(const cli_options *o, infer_run *r, ag_err *err) {
    memset(r, 0, sizeof *r);
    r->new_tokens = o->new_tokens;
    r->use_cache = !o->no_cache;
    r->meta = o->meta;
    r->seed = o->seed;
    cli_parse_framework(o->framework, &r->framework);
    cli_parse_attention(o->attention, &r->attention);
    r->device = cli_device_kind(o);
    if (o->cmd == CLI_INFER && !cli_infer_dtype(o, &r->dtype, err)) return EXIT_USAGE;
    if (o->cmd != CLI_INFER) cli_parse_dtype("fp32", &r->dtype);
    int rc = cli_load_config(o, &r->cfg, r->st_path, sizeof r->st_path, err);
    if (rc == 0 && o->cmd == CLI_INFER) rc = cli_lora_from_options(o, &r->lora, err);
    if (rc == 0 && o->cmd == CLI_INFER) rc = cli_routing_prepare(o, &r->cfg, &r->routing, err);
    if (rc == 0) rc = cli_text_prepare(o, &r->cfg, &r->text, err);
    if (rc != 0) return rc;
    if (o->tokens && strchr(o->tokens, ';')) {
        if ((rc = parse_prompts(o->tokens, r, err)) != 0) return rc;
    } else if ((rc = cli_make_tokens(o, &r->cfg, &r->text, o->meta, &r->ids, &r->batch, &r->seq_len, err)) != 0) {
        return rc;
    }
    // The last new token is chosen but never run through the model: it needs no position.
    if (r->seq_len + r->new_tokens - 1 > r->cfg.max_positions) {
        ag_err_set(err,
                   "a %ld-token prompt and %ld new tokens run %ld tokens through the model, past its %lld positions "
                   "(max_position_embeddings)",
                   r->seq_len, r->new_tokens, r->seq_len + r->new_tokens - 1, (long long)r->cfg.max_positions);
        return EXIT_RUN_FAILED;
    }
    return 0;
}

void cli_infer_free(infer_run *r) {
    cli_routing_free(&r->routing);
    free(r->ids);
    free(r->mask);
    free(r->out);
    free(r->out_len);
    cli_text_free(&r->text);
    llama_generate_stats_free(&r->stats);
}

static void on_step(void *user, const llama_generate_step *s) {
    const infer_run *r = user;
    if (s->step == 0)
        cli_progress("prefill done, decode 0/%ld", r->new_tokens - 1);
    else
        cli_progress("decode %lld/%ld", (long long)s->step, r->new_tokens - 1);
}

// Every row has generated one of the end-of-text ids: the generation is over, as HF's generate
// ends it (a row that ended first goes on with the others, its later ids not reported).
static bool all_ended(void *user, const llama_generate_step *s) {
    infer_run *r = user;
    bool all = true;
    for (long b = 0; b < r->batch; b++) {
        // a row still open has been extended at every step, and its last id did not end it
        int32_t last = s->step ? r->out[b * r->new_tokens + s->step - 1] : -1;
        if (r->out_len[b] == s->step && !cli_text_is_eos(&r->text, last)) r->out_len[b]++;
        if (r->out_len[b] == s->step + 1 && !cli_text_is_eos(&r->text, s->next[b])) all = false;
    }
    return r->text.eos.n > 0 && all;
}

int cli_infer_run(infer_run *r, ag_err *err) {
    int rc = -1;
    llama_model *m = NULL;
    ag_ctx *ctx = ag_ctx_new();
    r->out = calloc((size_t)(r->batch * r->new_tokens), sizeof *r->out);
    r->out_len = calloc((size_t)r->batch, sizeof *r->out_len);
    if (!ctx || !r->out || !r->out_len) {
        ag_ctx_free(ctx);
        ag_err_set(err, "out of memory");
        return -1;
    }
    ag_ctx_set_framework(ctx, r->framework);
    ag_ctx_set_attention(ctx, r->attention);
    ag_ctx_set_device(ctx, r->device);
    ag_set_grad_enabled(ctx, false);
    mp_set_phase(MP_PHASE_LOAD);
    if (cli_model_build_lora(ctx, &r->cfg, &r->dtype, &r->lora, r->st_path, r->seed, &m, err) != 0) goto done;
    cli_routing_attach(&r->routing, m);
    llama_generate_opts go = {.use_cache = r->use_cache, .on_step = on_step, .stop = all_ended, .user = r};
    cli_progress("prefill of %ld x %ld tokens", r->batch, r->seq_len);
    rc = llama_generate(ctx, m, &go, r->ids, r->mask, r->batch, r->seq_len, r->new_tokens, r->out, &r->stats, err);
done:
    mp_set_phase(MP_PHASE_TEARDOWN);
    llama_model_free(m);
    ag_ctx_free(ctx);
    return cli_run_end(rc, &r->torn_down_clean, err);
}

bool cli_infer_dtype(const cli_options *o, cli_dtype *d, ag_err *err) {
    if (!cli_parse_dtype(o->dtype, d) || d->master || d->grad_bits != d->act_bits) {
        ag_err_set(
            err, "--dtype of a generation must be fp32, bf16 or fp16 (mixed precision is a training setting), not '%s'",
            o->dtype);
        return false;
    }
    if (o->weight_dtype) cli_parse_weight_dtype(o->weight_dtype, o->group_size, d);
    return true;
}

static int act_bytes(const infer_run *r) { return r->dtype.name ? r->dtype.act_bits / 8 : 4; }

static uint64_t cache_per_token(const infer_run *r) {
    const llama_config *c = &r->cfg;
    return llama_kv_cache_elems_per_token(c) * (uint64_t)act_bytes(r);
}

// The tokens of the forwards that ran (fewer than asked when end-of-text stopped them) a second.
static double tokens_per_s(const infer_run *r) {
    const llama_generate_stats *st = &r->stats;
    return st->generate_s > 0 ? (double)(r->batch * st->steps) / st->generate_s : 0;
}

static json_t *shape_json(const int64_t s[4]) {
    json_t *a = json_array();
    for (int i = 0; i < 4; i++) json_array_append_new(a, json_integer(s[i]));
    return a;
}

typedef struct {
    const cli_options *o;
    infer_run r;
    cli_job job;
    cli_device dev;
    cli_device_result devr;
} infer_cmd;

static json_t *infer_json(const void *arg, bool failed) {
    const cli_options *o = ((const infer_cmd *)arg)->o;
    const infer_run *r = &((const infer_cmd *)arg)->r;
    json_t *root = cli_report_root(&r->cfg);
    json_t *run = json_object();
    json_object_set_new(run, "kind", json_string("infer"));
    json_object_set_new(run, "batch", json_integer(r->batch));
    json_object_set_new(run, "seq_len", json_integer(r->seq_len));
    json_object_set_new(run, "new_tokens", json_integer(r->new_tokens));
    json_object_set_new(run, "cache", json_boolean(r->use_cache));
    json_object_set_new(run, "framework", json_string(cli_framework_name(r->framework)));
    cli_mtp_json(run, &r->cfg);
    cli_mla_cache_json(run, &r->cfg);
    if (r->cfg.moe.experts > 0)
        json_object_set_new(run, "routing", json_string(cli_routing_name(&r->routing, r->meta)));
    json_object_set_new(run, "attention", json_string(cli_attention_name(r->attention)));
    json_object_set_new(run, "dtype", json_string(r->dtype.name ? r->dtype.long_name : "float32"));
    json_object_set_new(run, "weight_dtype",
                        json_string(r->dtype.weight_name ? r->dtype.weight_name
                                    : r->dtype.name      ? r->dtype.long_name
                                                         : "float32"));
    json_object_set_new(run, "meta", json_boolean(r->meta));
    json_object_set_new(run, "threads", json_integer(o->threads));
    json_object_set_new(run, "weights", json_string(r->st_path[0] ? r->st_path : "random"));
    json_object_set_new(root, "run", run);
    json_t *gen = json_array(), *text = json_array();
    for (long b = 0; b < r->batch && !failed && !r->meta; b++) {
        json_t *row = json_array();
        for (long t = 0; t < r->out_len[b]; t++)
            json_array_append_new(row, json_integer(r->out[b * r->new_tokens + t]));
        json_array_append_new(gen, row);
        char *s = cli_text_decode(&r->text, r->out + b * r->new_tokens, r->out_len[b]);
        if (s) json_array_append_new(text, json_string(s));
        free(s);
    }
    json_object_set_new(root, "generated", gen);
    if (r->text.ids) json_object_set_new(root, "prompt_ids", cli_prompt_ids_json(&r->text, r->batch));
    if (json_array_size(text))
        json_object_set_new(root, "generated_text", text);
    else
        json_decref(text);
    mp_report_json(root);
    json_object_set_new(root, "breakdown", cli_breakdown_json((long)r->cfg.layers));
    const llama_generate_stats *st = &r->stats;
    json_t *cache = json_object();
    json_object_set_new(cache, "bytes_per_token", json_integer((json_int_t)cache_per_token(r)));
    if (st->steps > 0 && r->use_cache) {
        json_object_set_new(cache, "after_prefill_bytes", json_integer((json_int_t)st->cache_bytes[0]));
        json_object_set_new(cache, "final_bytes", json_integer((json_int_t)st->cache_bytes[st->steps - 1]));
        json_object_set_new(cache, "final_usable_bytes", json_integer((json_int_t)st->cache_usable[st->steps - 1]));
        json_object_set_new(cache, "shape_after_prefill", shape_json(st->cache_shape[0]));
        json_object_set_new(cache, "shape_final", shape_json(st->cache_shape[st->steps - 1]));
    }
    json_object_set_new(root, "cache", cache);
    json_t *t = json_object();
    json_object_set_new(t, "prefill_s", json_real(st->prefill_s));
    json_object_set_new(t, "decode_s", json_real(st->decode_s));
    json_object_set_new(t, "generate_s", json_real(st->generate_s));
    json_object_set_new(t, "decode_step_s", json_real(st->decode_step_s));
    json_object_set_new(t, "tokens_per_s", json_real(tokens_per_s(r)));
    if (!failed)
        json_object_set_new(root, "timing", t);
    else
        json_decref(t);
    json_object_set_new(root, "teardown_all_zero", json_boolean(r->torn_down_clean));
    const infer_cmd *c = arg;
    if (c->devr.done) json_object_set_new(root, "device", cli_device_json(&c->dev, &c->devr));
    return root;
}

static void infer_text(FILE *f, const void *arg, bool failed) {
    const infer_run *r = &((const infer_cmd *)arg)->r;
    const llama_generate_stats *st = &r->stats;
    char b[80];
    fprintf(f, "membill infer: %s, batch %ld x %ld-token prompt, %ld new tokens, greedy, %s, %s%s%s%s\n", r->cfg.name,
            r->batch, r->seq_len, r->new_tokens, r->use_cache ? "with the KV cache" : "without a cache (recomputing)",
            r->dtype.name ? r->dtype.long_name : "float32", r->dtype.weight_name ? ", weights " : "",
            r->dtype.weight_name ? r->dtype.weight_name : "", r->meta ? ", meta (shapes only)" : "");
    char fw[192];
    fprintf(f, "framework: %s; attention: %s\n", cli_framework_text(r->framework, r->cfg.family, fw, sizeof fw),
            cli_attention_text(r->attention));
    cli_routing_text(f, &r->cfg, &r->routing, r->meta);
    cli_mla_cache_text(f, &r->cfg);
    cli_text_line(f, &r->text);
    fputc('\n', f);
    if (failed) fprintf(f, "(FAILED after %lld of %ld forwards: see below)\n\n", (long long)st->steps, r->new_tokens);
    mp_report_text(f);
    cli_breakdown_text(f, (long)r->cfg.layers);
    uint64_t per = cache_per_token(r);
    char kf[160];
    fprintf(f, "\n  KV cache: %s x %d bytes = %llu bytes a token per row\n",
            llama_kv_cache_formula(&r->cfg, kf, sizeof kf), act_bytes(r), (unsigned long long)per);
    if (r->use_cache && st->steps > 0) {
        const int64_t *s0 = st->cache_shape[0], *s1 = st->cache_shape[st->steps - 1];
        fprintf(f, "    after the prompt %s, each block's keys (%lld, %lld, %lld, %lld)\n",
                mp_format_bytes(b, sizeof b, st->cache_bytes[0]), (long long)s0[0], (long long)s0[1], (long long)s0[2],
                (long long)s0[3]);
        fprintf(f, "    at the end %s, keys (%lld, %lld, %lld, %lld)",
                mp_format_bytes(b, sizeof b, st->cache_bytes[st->steps - 1]), (long long)s1[0], (long long)s1[1],
                (long long)s1[2], (long long)s1[3]);
        fprintf(f, "; in allocator size classes %s\n", mp_format_bytes(b, sizeof b, st->cache_usable[st->steps - 1]));
    }
    if (!r->meta && !failed) {
        fprintf(f, "\n  prefill %.4f s, decode %.4f s (median step %.4f s), together %.4f s: %.1f tokens/s\n",
                st->prefill_s, st->decode_s, st->decode_step_s, st->generate_s, tokens_per_s(r));
        if (st->steps < r->new_tokens)
            fprintf(f, "  every row reached end-of-text: generation stopped after %lld of %ld tokens\n",
                    (long long)st->steps, r->new_tokens);
        for (long row = 0; row < r->batch && row < 8; row++) {
            fprintf(f, "  row %ld:", row);
            for (long t = 0; t < r->out_len[row] && t < 40; t++) fprintf(f, " %d", r->out[row * r->new_tokens + t]);
            fprintf(f, "%s\n", r->out_len[row] > 40 ? " ..." : "");
            char *s = cli_text_decode(&r->text, r->out + row * r->new_tokens, r->out_len[row]);
            if (s) fprintf(f, "  row %ld text: %s\n", row, s);
            free(s);
        }
    }
    fprintf(f, "  teardown: every category but other back at zero: %s\n", r->torn_down_clean ? "yes" : "NO");
    const infer_cmd *c = arg;
    if (c->devr.done) cli_device_text(f, &c->dev, &c->devr);
}

// The generation (its routing written when asked), then (--device cuda) its allocations through
// the CUDA caching allocator.
static int run(void *arg, ag_err *err) {
    infer_cmd *c = arg;
    int rc = cli_infer_run(&c->r, err);
    if (rc == 0 && c->r.routing.record && c->o->routing_out)
        rc = cli_outputs_write(c->job.outs, "--routing-out", cli_routing_writer, c->r.routing.record, err);
    if (rc != 0 || !c->dev.cuda) return rc;
    cli_device_mark *marks = NULL;
    size_t n = cli_device_marks_phases(&marks);
    return cli_device_after_run(&c->dev, marks, n, 0, &c->devr, err);
}

infer_run cli_infer_meta_copy(const infer_run *r) {
    infer_run m = *r;
    m.meta = true;
    m.out = NULL;
    m.out_len = NULL;
    m.text.eos.n = 0; // shapes alone choose no ids: nothing ends the generation early
    memset(&m.stats, 0, sizeof m.stats);
    return m;
}

void cli_infer_meta_free(infer_run *m) {
    free(m->out);
    free(m->out_len);
    llama_generate_stats_free(&m->stats);
}

static uint64_t meta_peak(void *arg, ag_err *err) {
    infer_run m = cli_infer_meta_copy(&((const infer_cmd *)arg)->r);
    mp_options mo = {.meta = true};
    if (mp_init(&mo) != MP_OK) return 0;
    uint64_t peak = cli_infer_run(&m, err) == 0 ? mp_peak().total : 0;
    mp_shutdown();
    cli_infer_meta_free(&m);
    return peak;
}

int cmd_infer(const cli_options *o) {
    infer_cmd c = {.o = o};
    ag_err err = {""};
    int rc = cli_infer_prepare(o, &c.r, &err);
    if (rc == 0) rc = cli_device_prepare(o, 1, &c.dev, &err);
    if (rc != 0) {
        fprintf(stderr, "membill infer: %s\n", err.msg);
        cli_infer_free(&c.r);
        return rc;
    }
    char title[256];
    snprintf(title, sizeof title, "membill infer: %s, batch %ld x %ld tokens + %ld new, %s", c.r.cfg.name, c.r.batch,
             c.r.seq_len, c.r.new_tokens, c.r.use_cache ? "KV cache" : "no cache");
    c.job = (cli_job){.arg = &c,
                      .run = run,
                      .meta_peak = meta_peak,
                      .text = infer_text,
                      .json = infer_json,
                      .title = title,
                      .device = &c.dev};
    rc = cli_job_main(o, &c.job);
    cli_device_result_free(&c.devr);
    cli_infer_free(&c.r);
    return rc;
}
