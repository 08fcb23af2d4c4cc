// graph_flops (see graph_flops.h for the formulas and what is left out).
#include "runtime/graph_flops.h"

namespace easel::runtime {

double node_flops(const ggml_tensor* node) {
    if (!node) return 0.0;
    const ggml_tensor* a = node->src[0];
    const ggml_tensor* b = node->src[1];
    switch (node->op) {
        case GGML_OP_MUL_MAT:
        case GGML_OP_MUL_MAT_ID:
            // every dst element is one dot product of length K = src0's ne[0]
            return a ? 2.0 * (double)a->ne[0] * (double)ggml_nelements(node) : 0.0;
        case GGML_OP_FLASH_ATTN_EXT: {
            const ggml_tensor* q = a;
            const ggml_tensor* k = b;
            const ggml_tensor* v = node->src[2];
            if (!q || !k || !v) return 0.0;
            // q {Dk, Nq, H, B}, k {Dk, Nkv, Hkv, B}, v {Dv, Nkv, Hkv, B}
            const double rows = (double)q->ne[1] * (double)q->ne[2] * (double)q->ne[3];  // Nq x H x B
            const double nkv = (double)k->ne[1];
            return 2.0 * rows * nkv * ((double)q->ne[0] + (double)v->ne[0]);
        }
        case GGML_OP_CONV_2D:  // kernel {kw, kh, Cin, Cout}
            return a ? 2.0 * (double)a->ne[0] * (double)a->ne[1] * (double)a->ne[2] * (double)ggml_nelements(node) : 0.0;
        case GGML_OP_CONV_2D_DW:  // kernel {kw, kh, 1, C}
            return a ? 2.0 * (double)a->ne[0] * (double)a->ne[1] * (double)ggml_nelements(node) : 0.0;
        case GGML_OP_CONV_TRANSPOSE_2D:  // kernel {kw, kh, Cout, Cin}, input {W, H, Cin, N}
            return a && b ? 2.0 * (double)a->ne[0] * (double)a->ne[1] * (double)a->ne[2] * (double)ggml_nelements(b) : 0.0;
        default:
            return 0.0;
    }
}

double graph_flops(const ggml_cgraph* gf) {
    if (!gf) return 0.0;
    ggml_cgraph* g = const_cast<ggml_cgraph*>(gf);  // ggml's accessors take a non-const graph
    double total = 0.0;
    const int n = ggml_graph_n_nodes(g);
    for (int i = 0; i < n; ++i) total += node_flops(ggml_graph_node(g, i));
    return total;
}

}  // namespace easel::runtime
