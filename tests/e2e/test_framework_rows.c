// The frameworks' table: every field of the rows is read by some code. The command runs in this
// process (its library) over the settings that reach every decision a framework makes: each
// framework's training step, checkpointed or not, flash, autocast, LoRA with dropout over an NF4
// base, foreach Adam, a generation, a plan, and the help. A field that nothing reads fails here,
// naming it: a decision the table states and no op, model, optimizer or command takes.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli.h"

static char config_path[256], moe_path[256];

static void write_config(void) {
    snprintf(config_path, sizeof config_path, "/tmp/membill_rows_%d.json", (int)getpid());
    FILE *f = fopen(config_path, "w");
    assert_non_null(f);
    fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300, "
               "\"tie_word_embeddings\": true}\n");
    fclose(f);
    // a mixture of experts: its router and experts
    snprintf(moe_path, sizeof moe_path, "/tmp/membill_rows_moe_%d.json", (int)getpid());
    f = fopen(moe_path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"model_type\": \"mixtral\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 300, "
            "\"num_local_experts\": 4, \"num_experts_per_tok\": 2}\n");
    fclose(f);
}

// One command line, run as main would (its text report to /dev/null); returns its exit code.
static int run_line(const char *line) {
    char buf[1024];
    snprintf(buf, sizeof buf, "membill %s", line);
    char *argv[64];
    int argc = 0;
    for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " "))
        argv[argc++] = !strcmp(t, "CONFIG") ? config_path : !strcmp(t, "MOE") ? moe_path : t;
    argv[argc] = NULL;
    const cli_command *cmd = cli_find_command(argv[1]);
    assert_non_null(cmd);
    static cli_options o;
    memset(&o, 0, sizeof o);
    if (!cli_parse(&o, cmd, argc, argv) || !cli_check_combinations(&o)) return EXIT_USAGE;
    static int (*const run[])(const cli_options *) = {cmd_train, cmd_infer, cmd_compare,
                                                      cmd_plan,  cmd_check, cmd_snapshot};
    int i = 0;
    while ((1 << i) != (int)cmd->bit) i++;
    fflush(stdout);
    int saved = dup(1);
    FILE *null = freopen("/dev/null", "w", stdout);
    assert_non_null(null);
    int rc = run[i](&o);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return rc;
}

static const char *const lines[] = {
    "train --meta --config CONFIG --seq-len 9 --steps 2 --framework lean",
    "train --meta --config CONFIG --seq-len 9 --steps 2 --framework pytorch",
    "train --meta --config CONFIG --seq-len 9 --steps 2 --framework pytorch-1.13 --adam-impl foreach",
    "train --meta --config CONFIG --seq-len 9 --framework pytorch --checkpointing",
    "train --meta --config CONFIG --seq-len 9 --framework pytorch --attention flash",
    "train --meta --config CONFIG --seq-len 9 --framework pytorch --dtype autocast-bf16",
    "train --meta --config CONFIG --seq-len 9 --framework pytorch --lora-rank 4 --lora-dropout 0.1 --base-dtype nf4",
    "infer --meta --config CONFIG --seq-len 5 --new-tokens 3 --framework pytorch",
    "plan --config CONFIG --seq-len 9 --framework pytorch --lora-rank 4 --lora-dropout 0.1",
    "train --meta --config MOE --seq-len 9 --framework pytorch-1.13",
    "train --meta --model phi-3-mini --seq-len 9 --framework pytorch",
};

// Refused settings read the rows too: flash where the framework has no SDPA, autocast where it
// has no autocast.
static const char *const refused[] = {
    "train --meta --config CONFIG --framework pytorch-1.13 --attention flash",
    "train --meta --config CONFIG --framework lean --dtype autocast-bf16",
    "train --meta --config CONFIG --framework lean --dtype bf16-autocast",
    "infer --meta --config CONFIG --framework pytorch --dtype bf16-autocast",
};

static void every_field_is_read(void **state) {
    (void)state;
    write_config();
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        int rc = run_line(lines[i]);
        if (rc != 0) print_error("membill %s: exit %d\n", lines[i], rc);
        assert_int_equal(rc, 0);
    }
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) assert_int_equal(run_line(refused[i]), EXIT_USAGE);
    FILE *null = fopen("/dev/null", "w");
    assert_non_null(null);
    cli_usage(null, cli_find_command("train")); // --framework's help: each row's brief
    fclose(null);
    remove(config_path);
    remove(moe_path);
    int unread = 0;
    for (int f = 0; f < AG_FW_NFIELDS; f++)
        if (!ag_framework_field_read((ag_framework_field)f)) {
            print_error("framework field %s (%s) is read by no code\n", ag_framework_field_name((ag_framework_field)f),
                        ag_framework_field_doc((ag_framework_field)f));
            unread++;
        }
    assert_int_equal(unread, 0);
}

// Every row has a text for every field, and the rows differ from each other somewhere.
static void every_row_is_described(void **state) {
    (void)state;
    for (int r = 0; r < AG_NFRAMEWORKS; r++) {
        const ag_framework_row *row = ag_framework_row_of((ag_framework)r);
        assert_non_null(row);
        for (int f = 0; f < AG_FW_NFIELDS; f++) {
            const char *v = ag_framework_field_value(row, (ag_framework_field)f);
            if (!v) print_error("row %s: field %s has no text\n", row->name, ag_framework_field_name(f));
            assert_non_null(v);
            assert_non_null(ag_framework_field_doc((ag_framework_field)f));
        }
        for (int s = 0; s < r; s++) {
            const ag_framework_row *other = ag_framework_row_of((ag_framework)s);
            int differ = 0;
            for (int f = AG_FWF_brief + 1; f < AG_FW_NFIELDS; f++)
                differ += strcmp(ag_framework_field_value(row, f), ag_framework_field_value(other, f)) != 0;
            assert_true(differ > 0);
        }
    }
    assert_null(ag_framework_row_of((ag_framework)AG_NFRAMEWORKS));
}

// membill help frameworks's table for the given rows, as text or Markdown (malloc'd).
static char *table_of(const ag_framework_row *const rows[], bool markdown) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    cli_frameworks_table(f, rows, AG_NFRAMEWORKS, markdown);
    assert_int_equal(fclose(f), 0);
    return buf;
}

// One field of src into dst, whatever its type.
static void copy_field(ag_framework_row *dst, const ag_framework_row *src, ag_framework_field f) {
    switch (f) {
#define COPY_FIELD(type, field)                                                                                        \
    case AG_FWF_##field: dst->field = src->field; break;
        AG_FW_FIELDS(COPY_FIELD)
#undef COPY_FIELD
    default: break;
    }
}

// The table is printed from the rows: it names every row and every field, and giving any row
// another row's value of any field changes it (in both forms). A field whose value is the same in
// every row decides nothing, and fails here.
static void help_table_follows_the_rows(void **state) {
    (void)state;
    const ag_framework_row *rows[AG_NFRAMEWORKS];
    for (int r = 0; r < AG_NFRAMEWORKS; r++) rows[r] = ag_framework_row_of((ag_framework)r);
    for (int md = 0; md < 2; md++) {
        char *table = table_of(rows, md);
        for (int r = 0; r < AG_NFRAMEWORKS; r++) assert_non_null(strstr(table, rows[r]->name));
        for (int f = AG_FWF_name + 1; f < AG_FW_NFIELDS; f++) {
            char line[128];
            snprintf(line, sizeof line, md ? "| `%s` | %s |" : "\n%s: %s\n", ag_framework_field_name(f),
                     ag_framework_field_doc(f));
            if (!strstr(table, line)) print_error("the table lacks field %s\n", ag_framework_field_name(f));
            assert_non_null(strstr(table, line));
        }
        for (int f = 0; f < AG_FW_NFIELDS; f++) {
            int changes = 0;
            for (int a = 0; a < AG_NFRAMEWORKS; a++)
                for (int b = 0; b < AG_NFRAMEWORKS; b++) {
                    if (!strcmp(ag_framework_field_value(rows[a], f), ag_framework_field_value(rows[b], f))) continue;
                    ag_framework_row changed = *rows[a];
                    copy_field(&changed, rows[b], (ag_framework_field)f);
                    const ag_framework_row *other[AG_NFRAMEWORKS];
                    memcpy(other, rows, sizeof other);
                    other[a] = &changed;
                    char *t = table_of(other, md);
                    if (!strcmp(t, table))
                        print_error("row %s took %s's %s, the table did not change\n", rows[a]->name, rows[b]->name,
                                    ag_framework_field_name(f));
                    assert_string_not_equal(t, table);
                    free(t);
                    changes++;
                    break; // one other value a row
                }
            if (!changes) print_error("field %s has one value in every row\n", ag_framework_field_name(f));
            assert_int_not_equal(changes, 0);
        }
        free(table);
    }
}

// docs/frameworks.md holds `membill help frameworks --markdown`'s table as the rows print it now.
static void docs_hold_the_table(void **state) {
    (void)state;
    FILE *doc = fopen(MEMBILL_FRAMEWORKS_DOC, "r");
    assert_non_null(doc);
    char *text = NULL;
    size_t cap = 0;
    assert_true(getdelim(&text, &cap, '\0', doc) > 0);
    fclose(doc);
    char *table = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&table, &len);
    assert_non_null(f);
    cli_frameworks_help(f, true);
    assert_int_equal(fclose(f), 0);
    if (!strstr(text, table))
        print_error("%s: its table is not the rows' (write it again: membill help frameworks --markdown)\n",
                    MEMBILL_FRAMEWORKS_DOC);
    assert_non_null(strstr(text, table));
    free(table);
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(docs_hold_the_table),
        cmocka_unit_test(every_row_is_described),
        cmocka_unit_test(help_table_follows_the_rows),
        cmocka_unit_test(every_field_is_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
