/*
 * test_quant_names.c — the --quant names the importers and `cmf quantize`
 * accept (issue 17, item 15): CMF's own names and llama.cpp's (Q8_0 ->
 * q8_row, Q4_0 -> q4_block, F16, BF16, F32), in any letter case; "keep"
 * only where allowed; an unknown name is CMF_ERR_ARG with a message that
 * names it and lists what is accepted. Also the defaults (item 17):
 * import-gguf keeps the GGUF's types, convert writes q8_row.
 */
#include "import/import_internal.h"
#include "test.h"

static void accepts(const char *name, bool allow_keep, cmf_dtype want, bool keep) {
    cmf_imp_quant q;
    cmf_error err = {0};
    cmf_status st = cmf_imp_quant_parse(name, allow_keep, &q, &err);
    CHECK(st == CMF_OK, "--quant %s: %s", name, err.msg);
    if (st) return;
    CHECK(q.keep == keep && (keep || q.matrix == want), "--quant %s: got %s%s, expected %s", name,
          cmf_dtype_name(q.matrix), q.keep ? " (keep)" : "", keep ? "keep" : cmf_dtype_name(want));
}

static void refuses(const char *name, bool allow_keep) {
    cmf_imp_quant q;
    cmf_error err = {0};
    CHECK(cmf_imp_quant_parse(name, allow_keep, &q, &err) == CMF_ERR_ARG, "--quant %s accepted", name);
    char quoted[64];
    snprintf(quoted, sizeof quoted, "'%s'", name);
    static const char *const listed[] = {"f32", "f16", "bf16", "q8", "q8_row", "Q8_0", "q8_2f", "q4", "q4_block",
                                         "Q4_0", "q4t", "q4_tiled", "q4tp", "case-insensitive"};
    CHECK(strstr(err.msg, quoted), "--quant %s: the message does not name it: %s", name, err.msg);
    for (size_t i = 0; i < sizeof listed / sizeof *listed; i++)
        CHECK(strstr(err.msg, listed[i]), "--quant %s: the message does not list %s: %s", name, listed[i], err.msg);
    CHECK(!strstr(err.msg, "keep") == !allow_keep, "--quant %s: 'keep' listed %s: %s", name,
          allow_keep ? "not" : "but not accepted", err.msg);
}

int main(void) {
    /* llama.cpp's names, as llama-quantize and convert_hf_to_gguf spell them */
    accepts("Q8_0", false, CMF_DT_Q8_ROW, false);
    accepts("Q4_0", false, CMF_DT_Q4_BLOCK, false);
    accepts("F16", false, CMF_DT_F16, false);
    accepts("BF16", false, CMF_DT_BF16, false);
    accepts("F32", false, CMF_DT_F32, false);
    /* any case, CMF's names too */
    accepts("q8_0", false, CMF_DT_Q8_ROW, false);
    accepts("q4_0", false, CMF_DT_Q4_BLOCK, false);
    accepts("Q8", false, CMF_DT_Q8_ROW, false);
    accepts("Q8_ROW", false, CMF_DT_Q8_ROW, false);
    accepts("Q8_2F", false, CMF_DT_Q8_2F, false);
    accepts("Q4", false, CMF_DT_Q4_BLOCK, false);
    accepts("Q4T", false, CMF_DT_Q4_TILED, false);
    accepts("Q4_Tiled", false, CMF_DT_Q4_TILED, false);
    accepts("Q4TP", false, CMF_DT_Q4TP, false);
    accepts("f16", false, CMF_DT_F16, false);
    accepts("KEEP", true, CMF_DT_F32, true);
    accepts("keep", true, CMF_DT_F32, true);
    /* names with no CMF dtype, and keep where it means nothing */
    refuses("Q4_K_M", false);
    refuses("q5_0", true);
    refuses("q3", false);
    refuses("", true);
    refuses("KEEP", false);

    /* defaults (item 17): import-gguf keeps, convert writes q8_row */
    cmf_imp_quant q;
    cmf_writer_opts wo;
    cmf_error err = {0};
    char out[4200];
    snprintf(out, sizeof out, "%s/x.cmf", test_tmp_dir("import_quant_names"));
    CHECK(cmf_imp_begin(NULL, "keep", true, out, &q, &wo, &err) == CMF_OK && q.keep, "import-gguf default: %s",
          err.msg);
    cmf_import_opts o = {.quant = NULL, .shard_max_gb = 1};
    CHECK(cmf_imp_begin(&o, "q8", false, out, &q, &wo, &err) == CMF_OK && !q.keep && q.matrix == CMF_DT_Q8_ROW &&
              wo.shard_max_bytes == 1000000000ull && !wo.cancel,
          "convert default: %s", err.msg);
    return test_done();
}
