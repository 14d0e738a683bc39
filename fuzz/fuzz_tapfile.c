/* libFuzzer target: the tap-file reader and every verb that reads tap files
 * (compare, audit, the self-check, the pinned-decode token reader, the golden
 * check). Inputs are whole files; seeds are tap files and goldens written by
 * tapdiff (fuzz/run.sh).
 * By default the reader works as shipped: the first reading happens in a
 * forked child, so a finding is a crash, leak or sanitizer report in the
 * process that uses the file (the contract). TD_FUZZ_INPROCESS=1 reads in
 * this process (TD_TAPFILE_INPROCESS=1) for coverage of the library's
 * parsing: findings inside libhdf5 frames are then the HDF5 library's own
 * (Debian 1.10.8 overflows on corrupt object headers and heaps), which the
 * isolation turns into exit 3. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "audit.h"
#include "compare.h"
#include "golden.h"
#include "runner.h"
#include "selfcheck.h"
#include "tapfile.h"

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *in = getenv("TD_FUZZ_INPROCESS");
    if (in && !strcmp(in, "1")) setenv("TD_TAPFILE_INPROCESS", "1", 1);
    // A file that makes the HDF5 library loop is refused when the checker
    // child has spent this much CPU time; the shipped 30 s would outlast
    // libFuzzer's -timeout on a busy machine and report the contract's own
    // refusal as a hang (fuzz/regress/tapfile/).
    setenv("TD_TAPFILE_CHECK_SECONDS", "1", 0);
    snprintf(path, sizeof path, "/tmp/td_fuzz_tap_%d.h5", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    td_err err;
    td_tapfile *tf = NULL;
    // Every verb opens the file through td_tapfile_open first: an input it
    // refuses goes no further in any of them.
    if (td_tapfile_open(&tf, path, &err) != TD_OK) {
        unlink(path);
        return 0;
    }
    td_tapfile_close(tf);
    td_cmp_result *cr = NULL;
    td_cmp_options o = td_cmp_options_default();
    if (td_compare(path, path, &o, &cr, &err) == TD_OK) td_cmp_result_free(cr);
    td_audit_result *ar = NULL;
    if (td_audit(path, NULL, NULL, &ar, &err) == TD_OK) td_audit_result_free(ar);
    td_selfcheck_report rep;
    td_selfcheck_file(path, &rep, &err);
    int32_t *prompt = NULL, *decode = NULL;
    int64_t np = 0, nd = 0;
    if (td_read_tapfile_tokens(path, &prompt, &np, &decode, &nd, &err) == TD_OK) {
        free(prompt);
        free(decode);
    }
    td_golden_info gi;
    td_golden_check(path, &gi, &err);
    unlink(path);
    return 0;
}
