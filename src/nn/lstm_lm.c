/* The LSTM language model (fg_lstm_lm_new): Embedding, a batch-first LSTM
 * and a Linear head under PyTorch's names (embedding, lstm, fc), so that its
 * state dict is that of the three-attribute PyTorch module. Where the
 * vocabulary is smaller than the tokens of a batch, the LSTM's first layer
 * projects the embedding table once and picks its rows (rnn.c's
 * fg__rnn_forward_embedded) instead of projecting every embedded token. */
#include "nn_impl.h"

static fg_tensor *lm_fwd(fg_module *m, fg_tensor *idx, void *ud) {
    (void)ud;
    fg_module *emb = fg_module_child(m, "embedding"), *lstm = fg_module_child(m, "lstm");
    bool applied; /* the first layer's input projection from the projected embedding table */
    fg_tensor *h = fg__rnn_forward_embedded(lstm, emb, idx, &applied);
    if (!applied) h = fg_module_forward(lstm, fg_module_forward(emb, idx));
    return fg_module_forward(fg_module_child(m, "fc"), h);
}

fg_module *fg_lstm_lm_new(const fg_lstm_lm_config *c) {
    if (!c || c->vocab <= 0 || c->embd <= 0 || c->hidden <= 0 || c->layers < 0) {
        fg_error(FG_EINVAL,
                 "lstm_lm: vocab %lld, embd %lld, hidden %lld, layers %lld: expected > 0",
                 c ? (long long)c->vocab : 0LL, c ? (long long)c->embd : 0LL,
                 c ? (long long)c->hidden : 0LL, c ? (long long)c->layers : 0LL);
        return NULL;
    }
    fg_dtype dt;
    if (fg__model_dtype(c->dtype, "lstm_lm", &dt) != FG_OK) return NULL;
    fg_module *m = fg_module_new("LSTMLanguageModel", lm_fwd, NULL, NULL);
    if (!m) return NULL;
    fg_rnn_opts o = {.num_layers = c->layers, .batch_first = true};
    if (fg_module_add_child(m, "embedding", fg_embedding_new(c->vocab, c->embd, dt)) ||
        fg_module_add_child(m, "lstm", fg_lstm_new(c->embd, c->hidden, &o, dt)) ||
        fg_module_add_child(m, "fc", fg_linear_new(c->hidden, c->vocab, true, dt)) ||
        (c->seed && fg_module_set_seed(m, c->seed)) || fg_module_finalize(m)) {
        fg_module_free(m);
        return NULL;
    }
    return m;
}
