/* The cuda backend's host side, checked where no GPU exists (CI):
 *   - launch configurations cover their shapes exactly (cuda_launch.h);
 *   - every type the loader decodes has a device decode unit, and the
 *     dispatch the kernels use (model/blocks.h's per-block decoders, compiled
 *     by nvcc, here for the host) equals the C loader's row decoders
 *     (model/types.c) bit for bit on random blocks of every type;
 *   - `tapdiff run --backend cuda` exits 77 with one clear line where no
 *     driver or device exists.
 * With a device (suite `gpu`): cuda vs ref bisect is conformant on every
 * fixture; without one those tests skip, saying why. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda.h"
#include "cuda_dev.h"
#include "cuda_launch.h"
#include "fixtures.h"
#include "forward.h"
#include "td_test.h"
#include "types.h"

/* ------------------------------------------------------------ launches */

Test(cuda_launch, matmul_grid_covers_every_row_once) {
    const int64_t rows[] = {1, 3, 4, 5, 128, 257, 32000, 151936};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const td_cuda_launch l = td_cuda_mm_launch(rows[i], 1);
        const int64_t warps = (int64_t)l.grid_x * (l.block / TD_CUDA_WARP);
        cr_expect_eq(l.block % TD_CUDA_WARP, 0u, "whole warps: the shuffles need them");
        cr_expect(warps >= rows[i] && warps - rows[i] < TD_CUDA_MV_WARPS, "rows %lld: %u blocks of %u threads",
                  (long long)rows[i], l.grid_x, l.block);
        cr_expect_eq(l.grid_y, 1u);
    }
    // MoE: one grid row per (token, slot) pair
    cr_expect_eq(td_cuda_mm_launch(64, 6).grid_y, 6u);
    cr_expect_eq(td_cuda_mm_launch(64, 0).grid_y, 1u, "never an empty grid");
}

Test(cuda_launch, elementwise_and_row_grids_cover_their_range) {
    const int64_t ns[] = {1, 255, 256, 257, 1 << 20};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        const td_cuda_launch l = td_cuda_elem_launch(ns[i]);
        const int64_t threads = (int64_t)l.grid_x * l.block;
        cr_expect(threads >= ns[i] && threads - ns[i] < l.block, "n %lld: %lld threads", (long long)ns[i],
                  (long long)threads);
    }
    cr_expect_eq(td_cuda_row_launch(37, 4096).grid_x, 37u, "one block per row");
    cr_expect_eq(td_cuda_row_launch(37, 4096).block % TD_CUDA_WARP, 0u);
    cr_expect_eq(TD_CUDA_ROW_THREADS / TD_CUDA_WARP <= 32, 1, "block_reduce keeps one partial per warp");
    cr_expect_eq(td_cuda_fp_launch(12345).grid_x, 1u, "the fingerprint is one block: no second pass");
}

Test(cuda_launch, attention_shared_memory_fits_up_to_the_declared_context) {
    const int64_t Ds[] = {1, 64, 128, 256};
    for (size_t i = 0; i < sizeof Ds / sizeof Ds[0]; i++) {
        const int64_t D = Ds[i], n = td_cuda_attn_max_ctx(D);
        cr_assert_gt(n, 0);
        const td_cuda_launch l = td_cuda_attn_launch(3, 8, n, D);
        cr_expect_eq(l.grid_x, 24u, "one block per (token, head)");
        // q (D) + scores with room for the stride-2 fault's reads (2n)
        cr_expect_eq(l.smem, (size_t)(D + 2 * n) * sizeof(float));
        cr_expect_leq(l.smem, (size_t)TD_CUDA_SMEM_DEFAULT, "D %lld: %zu bytes", (long long)D, l.smem);
        cr_expect_gt(td_cuda_attn_launch(3, 8, n + 1, D).smem, (size_t)TD_CUDA_SMEM_DEFAULT - sizeof(float),
                     "the bound is tight: one more position does not fit");
    }
}

/* ------------------------------------------------------------ decoders */

Test(cuda_decode, every_type_the_loader_decodes_has_a_device_decode_unit) {
    int n = 0;
    for (int t = 0; t < TD_TYPE_COUNT; t++) {
        const td_type_info *ti = td_type_get(t);
        int64_t v = 0, b = 0;
        const int ok = td_cuda_type_chunk(t, &v, &b);
        if (!ti || !ti->can_decode) {
            cr_expect_eq(ok, 0, "type %d is not decodable but the device claims it", t);
            continue;
        }
        n++;
        cr_expect_eq(ok, 1, "type %s: the device kernels do not decode it", ti->name);
        if (!ok) continue;
        cr_expect_leq(v, TD_CUDA_CHUNK_MAX, "%s", ti->name);
        if (ti->block_size > 1) cr_expect(v == ti->block_size && b == ti->block_bytes, "%s: unit = block", ti->name);
        else cr_expect(v == 32 && b == 32 * ti->block_bytes, "%s: runs of 32", ti->name);
    }
    cr_expect_geq(n, 30, "the loader decodes %d types", n);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint8_t rnd8(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}

/* Random bytes: every f16 / bf16 / f32 / f64 field is finite or not as
 * chance has it. Equal means the same bits, except that two NaNs are equal
 * whatever their payloads: the loader widens an f16 NaN through f32 (the
 * conversion sets the quiet bit) and blocks.h builds the f64 bits directly;
 * no consumer of the values reads a NaN's payload. */
Test(cuda_decode, nvcc_host_build_of_the_device_dispatch_equals_the_c_loader_bit_for_bit) {
    int n_types = 0;
    for (int t = 0; t < TD_TYPE_COUNT; t++) {
        const td_type_info *ti = td_type_get(t);
        if (!ti || !ti->can_decode) continue;
        int64_t cv = 0, cb = 0;
        cr_assert(td_cuda_type_chunk(t, &cv, &cb), "%s", ti->name);
        // two blocks; plain types 70 values: two full runs of 32 and a tail of 6
        const int64_t n = ti->block_size > 1 ? 2 * ti->block_size : 70;
        const size_t bytes = td_type_row_bytes(t, n);
        cr_assert_gt(bytes, 0u, "%s", ti->name);
        uint8_t *row = malloc(bytes);
        double *ref = malloc((size_t)n * sizeof *ref), *got = malloc((size_t)n * sizeof *got);
        for (int trial = 0; trial < 64; trial++) {
            for (size_t i = 0; i < bytes; i++) row[i] = rnd8();
            td_err err = {{0}};
            cr_assert_eq(td_decode_row_f64(t, row, ref, n, &err), TD_OK, "%s: %s", ti->name, err.msg);
            memset(got, 0xA5, (size_t)n * sizeof *got);
            int64_t done = 0;
            for (int64_t c = 0; done < n; c++) {
                const int m = td_cuda_host_decode(t, row, n, c, got + done);
                cr_assert_gt(m, 0, "%s: unit %lld decoded nothing", ti->name, (long long)c);
                cr_assert_leq(done + m, n, "%s: unit %lld overruns the row", ti->name, (long long)c);
                done += m;
            }
            for (int64_t i = 0; i < n; i++)
                if (memcmp(&ref[i], &got[i], sizeof ref[i]) && !(isnan(ref[i]) && isnan(got[i]))) {
                    char hex[3 * 64 + 1] = "";
                    for (size_t k = 0; k < bytes && k < 64; k++) snprintf(hex + 3 * k, 4, "%02x ", row[k]);
                    cr_assert_fail("%s trial %d value %lld: C %.17g, nvcc host %.17g; row bytes: %s", ti->name, trial,
                                   (long long)i, ref[i], got[i], hex);
                }
        }
        free(row), free(ref), free(got);
        n_types++;
    }
    cr_expect_geq(n_types, 30);
}

Test(cuda_decode, an_unknown_type_decodes_nothing) {
    double y[TD_CUDA_CHUNK_MAX];
    const uint8_t row[256] = {0};
    cr_expect_eq(td_cuda_host_decode(TD_TYPE_I32, row, 8, 0, y), 0);
    cr_expect_eq(td_cuda_host_decode(TD_TYPE_COUNT + 5, row, 8, 0, y), 0);
    int64_t v, b;
    cr_expect_eq(td_cuda_type_chunk(TD_TYPE_I8, &v, &b), 0);
}

/* ------------------------------------------------------------ routing */

Test(cuda_route, device_routing_equals_the_shared_rule_ties_included) {
    // probabilities drawn from few levels, so exact ties at the k-th boundary are common
    float p[64], w_ref[8], w_got[8];
    int32_t t_ref[8], t_got[8];
    int n_ties = 0;
    for (int trial = 0; trial < 2000; trial++) {
        const int64_t X = 2 + rnd8() % 63, K = 1 + rnd8() % (X < 8 ? X : 8);
        for (int64_t e = 0; e < X; e++) p[e] = (float)(rnd8() % 5) / 8.0f + (trial % 7 == 0 ? 0.0f : 1e-3f * (float)(rnd8() % 2));
        td_moe_route_f32(t_ref, w_ref, p, X, K, 0);
        td_cuda_host_moe_route(t_got, w_got, p, X, K);
        for (int64_t j = 0; j < K; j++) {
            cr_assert_eq(t_got[j], t_ref[j], "trial %d X %lld K %lld rank %lld", trial, (long long)X, (long long)K,
                         (long long)j);
            cr_assert(!memcmp(&w_got[j], &w_ref[j], sizeof(float)), "trial %d weight %lld: %a vs %a", trial,
                      (long long)j, (double)w_got[j], (double)w_ref[j]);
            n_ties += j > 0 && p[t_ref[j]] == p[t_ref[j - 1]];
        }
    }
    cr_expect_gt(n_ties, 100, "ties exercised: %d", n_ties);
}

/* ------------------------------------------------------------ no device */

static char tmpdir[256];
static void make_tmpdir(void) { td_test_tmpdir(tmpdir, sizeof tmpdir, "cuda"); }
static void remove_tmpdir(void) { td_test_rmdir(tmpdir); }

static int have_device(char *why, size_t n) {
    return td_cuda_backend.probe(why, n) == TD_OK;
}

Test(cuda_cli, run_without_a_device_exits_77_with_one_clear_line, .init = make_tmpdir, .fini = remove_tmpdir) {
    char why[256];
    if (have_device(why, sizeof why)) cr_skip_test("a CUDA device is present (%s): nothing to skip", why);
    const char *model = td_test_fixture(tmpdir, "llama-f32");
    char *out = NULL, *err = NULL;
    const char *args[] = {"run", "--model", model, "--backend", "cuda", "--tokens", "1,2,3", "--steps", "2", NULL};
    const int rc = td_test_tapdiff_run(tmpdir, &out, &err, args);
    cr_expect_eq(rc, 77, "exit %d; stderr: %s", rc, err);
    cr_expect(strstr(err, "cuda: cannot run here: no CUDA device here") != NULL, "stderr: %s", err);
    cr_expect_eq(out[0], '\0', "nothing on stdout: %s", out);
    // `backends` lists it as unavailable with the same reason
    free(out), free(err);
    const char *bargs[] = {"backends", NULL};
    cr_expect_eq(td_test_tapdiff_run(tmpdir, &out, &err, bargs), 0);
    cr_expect(strstr(out, "cuda") && strstr(out, "no CUDA device here"), "backends: %s", out);
    free(out), free(err);
}

Test(cuda_cli, bisect_and_fault_injection_without_a_device_skip_not_fail, .init = make_tmpdir,
     .fini = remove_tmpdir) {
    char why[256];
    if (have_device(why, sizeof why)) cr_skip_test("a CUDA device is present (%s)", why);
    const char *model = td_test_fixture(tmpdir, "llama-f32");
    const char *args[] = {"bisect", "--model", model, "--a", "ref", "--b", "cuda", "--inject", "cuda_smem_stride",
                          "--tokens", "1,2,3", "--steps", "1", "--quiet", "--out-dir", td_test_path(tmpdir, "b"),
                          NULL};
    char *err = NULL;
    const int rc = td_test_tapdiff_run(tmpdir, NULL, &err, args);
    cr_expect_eq(rc, 77, "exit %d: %s", rc, err);
    free(err);
    // a fault cuda does not implement is refused before anything runs (exit 2)
    const char *args2[] = {"run", "--model", model, "--backend", "cuda", "--inject", "rope_pairing",
                           "--tokens", "1,2", "--steps", "1", NULL};
    const int rc2 = td_test_tapdiff_run(tmpdir, NULL, &err, args2);
    cr_expect_eq(rc2, 2, "exit %d: %s", rc2, err);
    free(err);
}

/* ------------------------------------------------------------ on a device */

Test(gpu, cuda_is_conformant_with_ref_on_every_fixture, .init = make_tmpdir, .fini = remove_tmpdir,
     .timeout = 900) {
    char why[256];
    if (!have_device(why, sizeof why)) cr_skip_test("cuda: %s", why);
    int bad = 0;
    for (size_t i = 0; i < td_fixture_count(); i++) {
        const td_fixture_info *fi = td_fixture_at(i);
        if (!strcmp(fi->arch, "qwen3next")) { // Gated DeltaNet layers: cuda refuses them at open
            fprintf(stderr, "cuda vs ref on %-18s skipped (qwen3next: no GDN layers in cuda)\n", fi->name);
            continue;
        }
        if (!strcmp(fi->arch, "qwen4exp")) { // hyper-connection layers: cuda refuses them at open
            fprintf(stderr, "cuda vs ref on %-18s skipped (qwen4exp: no HC layers in cuda)\n", fi->name);
            continue;
        }
        const char *model = td_test_fixture(tmpdir, fi->name);
        char *out = NULL, *err = NULL;
        const char *args[] = {"bisect", "--model", model, "--a", "ref", "--b", "cuda", "--tokens", "1,17,42,99,7,250,31,64",
                              "--steps", "8", "--quiet", "--out-dir", td_test_path(tmpdir, fi->name), NULL};
        const int rc = td_test_tapdiff_run(tmpdir, &out, &err, args);
        fprintf(stderr, "cuda vs ref on %-18s exit %d\n", fi->name, rc);
        cr_expect_eq(rc, 0, "%s: exit %d\n%s%s", fi->name, rc, out, err);
        bad += rc != 0;
        free(out), free(err);
    }
    cr_expect_eq(bad, 0);
}
