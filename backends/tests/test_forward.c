/* The forward contract every backend shares (backends/forward.h): the token
 * history ring, the step checks, the layer-kind check, and the MoE router's
 * rule and fault flags. Expected values are worked out by hand here; the
 * registry test checks that every registered backend declares its layer kinds
 * and accepts the fixtures. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <string.h>

#include "backend.h"
#include "faults.h"
#include "forward.h"

Test(forward, hist_keeps_the_last_16_ids_oldest_first) {
    td_hist h;
    td_hist_reset(&h);
    int32_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = 100 + i;
    td_hist_push(&h, ids, 3);
    cr_assert_eq(h.n, 3);
    cr_expect(h.ids[0] == 100 && h.ids[2] == 102);
    td_hist_push(&h, ids + 3, 17); // 20 consumed: the window holds 104..119
    cr_assert_eq(h.n, 16);
    for (int i = 0; i < 16; i++) cr_expect_eq(h.ids[i], 104 + i, "slot %d", i);
    td_hist_reset(&h);
    cr_expect_eq(h.n, 0);
}

Test(forward, step_checks_name_the_backend_and_the_problem) {
    const int32_t ok[2] = {1, 2}, bad[2] = {1, 7};
    td_err err = {{0}};
    cr_expect_eq(td_fwd_check_step("xb", ok, 2, 0, 0, 8, 7, &err), TD_OK);
    cr_expect_eq(td_fwd_check_step("xb", ok, 0, 0, 0, 8, 7, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "xb: a forward needs at least one token"), "%s", err.msg);
    cr_expect_eq(td_fwd_check_step("xb", ok, 2, 3, 2, 8, 7, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "expected pos0 = 2, got 3"), "%s", err.msg);
    cr_expect_eq(td_fwd_check_step("xb", ok, 2, 7, 7, 8, 7, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "holds 8 positions") && strstr(err.msg, "7..8"), "%s", err.msg);
    cr_expect_eq(td_fwd_check_step("xb", bad, 2, 0, 0, 8, 7, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "token 1 of the step is id 7; the vocabulary has 7 ids"), "%s", err.msg);
}

Test(forward, a_layer_kind_the_backend_lacks_is_refused) {
    td_layer layers[2];
    memset(layers, 0, sizeof layers);
    td_model m;
    memset(&m, 0, sizeof m);
    m.hp.arch = TD_ARCH_QWEN3;
    m.hp.n_layer = 2;
    m.layers = layers;
    td_err err = {{0}};
    cr_expect_eq(td_fwd_check_layers("xb", TD_KINDS(TD_LAYER_ATTENTION), &m, &err), TD_OK);
    cr_expect_eq(td_fwd_check_layers("xb", 0, &m, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "xb: architecture qwen3 is not supported: block 0 is a attention layer"), "%s",
              err.msg);
    layers[1].kind = TD_LAYER_KIND_COUNT; // a kind from a newer model/ than this backend
    cr_expect_eq(td_fwd_check_layers("xb", TD_KINDS(TD_LAYER_ATTENTION), &m, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "block 1"), "%s", err.msg);
}

Test(forward, every_registered_backend_declares_attention_layers) {
    const td_backend_vt *const *all = td_backend_list();
    for (size_t i = 0; all[i]; i++)
        cr_expect(all[i]->layer_kinds & TD_KINDS(TD_LAYER_ATTENTION), "%s declares no attention layers",
                  all[i]->name);
}

/* probs {0.1, 0.3, 0.3, 0.2, 0.1}, K = 2: experts 1 and 2 tie at the top */
static const float k_probs[5] = {0.1f, 0.3f, 0.3f, 0.2f, 0.1f};

Test(moe_route, lower_index_wins_a_tie_and_weights_renormalise) {
    int32_t topk[2];
    float w[2];
    td_moe_route_f32(topk, w, k_probs, 5, 2, 0);
    cr_expect(topk[0] == 1 && topk[1] == 2, "topk %d %d", topk[0], topk[1]);
    cr_expect_float_eq(w[0], 0.5f, 1e-7f);
    cr_expect_float_eq(w[1], 0.5f, 1e-7f);
    double pd[3] = {0.25, 0.5, 0.25}, wd[2];
    int32_t td[2];
    td_moe_route_f64(td, wd, pd, 3, 2, 0);
    cr_expect(td[0] == 1 && td[1] == 0, "f64 topk %d %d", td[0], td[1]);
    cr_expect_eq(wd[0], 0.5 / 0.75);
}

Test(moe_route, fault_flags_change_exactly_their_rule) {
    int32_t topk[2];
    float w[2];
    td_moe_route_f32(topk, w, k_probs, 5, 2, TD_ROUTE_TIE_HIGH);
    cr_expect(topk[0] == 2 && topk[1] == 1, "tie_high: topk %d %d", topk[0], topk[1]);
    td_moe_route_f32(topk, w, k_probs, 5, 2, TD_ROUTE_NO_RENORM);
    cr_expect(topk[0] == 1 && topk[1] == 2);
    cr_expect_eq(w[0], 0.3f, "no renormalisation: the probability itself");
}

Test(moe_route, clamp_at_2_pow_minus_14) {
    const float tiny[3] = {0x1p-20f, 0x1p-21f, 0.0f};
    int32_t topk[2];
    float w[2];
    td_moe_route_f32(topk, w, tiny, 3, 2, 0);
    cr_expect_eq(w[0], 0x1p-20f / 0x1p-14f, "sum 1.5*2^-20 < 2^-14: divided by the clamp");
}

Test(forward, model_checks_name_the_bad_hyper_parameter) {
    td_layer layers[1];
    memset(layers, 0, sizeof layers);
    td_model m;
    memset(&m, 0, sizeof m);
    m.layers = layers;
    m.hp = (td_hparams){.arch = TD_ARCH_LLAMA, .n_layer = 1, .n_embd = 8, .n_head = 4, .n_head_kv = 3,
                        .head_dim = 2, .rope_dims = 2, .n_vocab = 5};
    td_err err = {{0}};
    const unsigned att = TD_KINDS(TD_LAYER_ATTENTION);
    cr_expect_eq(td_fwd_check_model("xb", att, &m, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "xb: bad hyper-parameters: E=8 H=4 Hkv=3"), "%s", err.msg);
    m.hp.n_head_kv = 2;
    cr_expect_eq(td_fwd_check_model("xb", att, &m, &err), TD_OK, "%s", err.msg);
    m.hp.rope_dims = 3;
    cr_expect_eq(td_fwd_check_model("xb", att, &m, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "rope dims R=3"), "%s", err.msg);
    m.hp.rope_dims = 2, m.hp.n_expert = 4, m.hp.n_expert_used = 5;
    cr_expect_eq(td_fwd_check_model("xb", att, &m, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "expert_used_count 5 must be in 1..expert_count 4"), "%s", err.msg);
    cr_expect_eq(td_fwd_check_matrix("xb", NULL, "attn_q", 3, 8, 8, &err), TD_EINPUT);
    cr_expect(strstr(err.msg, "xb: layer 3 has no attn_q tensor"), "%s", err.msg);
}
