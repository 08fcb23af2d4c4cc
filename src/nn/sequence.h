// Sequence: a large module as prologue -> block[0] -> ... -> block[n-1] -> epilogue.
//
// Why: the placement runtime must be able to build a graph for ANY contiguous range of blocks
// on ANY device (--max-vram segments, layer split across GPUs, streaming weights block by
// block with prefetch, per-block memory measurement). It can do that only if a module says
// where its blocks are and what crosses the boundary between two blocks. A Sequence says
// exactly that, with types instead of graph cuts found by tensor names:
//
//   Inputs  --prologue-->  State  --block(0)-->  State  ... --block(n-1)-->  State  --epilogue-->  Outputs
//
// * Inputs: graph tensors the caller provides (token ids, latent, timestep, context...).
// * State:  a small struct of graph tensors passed between blocks. For a transformer it is the
//   hidden state (plus e.g. an attention mask / rotary tables); for a UNet it is the hidden
//   state, the timestep embedding, the context AND the skip stack; for a VAE decoder the
//   feature map. Everything a later block reads must be in the State: a block may not reach
//   back into tensors made by the prologue or another block except through it.
// * Outputs: what the epilogue returns (e.g. last_hidden_state, pooled output).
//
// State must satisfy SequenceState: visit_tensors(f) calls f(name, ggml_tensor*&) on every
// tensor it holds (a stable name and order for a given block index), so the runtime can
//   1. end a segment after block k: mark each state tensor as a graph output and read it back
//      (or copy it to the next device),
//   2. start a segment at block k on another device: build a shape-only graph up to block k
//      in a scratch no_alloc context to learn the state's shapes, then replace every state
//      tensor by a fresh input tensor of the same shape (visit_tensors hands out references)
//      and call block(k), block(k+1), ... on it.
// Tensors a State holds that are pure functions of the inputs (a causal mask, rotary
// tables) may be recomputed instead; that is the module's choice, documented on its State.
//
// Each block's parameters should live in one Block subtree (block_params(i)), so that a
// residency plan can load, stream or evict exactly the weights of one block. Parameters used
// by the prologue and epilogue live elsewhere in the module's tree.
//
// forward() below is the one-device composition: prologue, all blocks in order, epilogue.
// forward_range() runs blocks [begin, end) on a given state: the building unit of segments.
#pragma once

#include "core/error.h"
#include "nn/layers.h"

#include <concepts>
#include <functional>
#include <vector>

namespace easel::nn {

/// Callback given every tensor of a State: a stable name ("h", "skip.3") and a reference the
/// runtime may replace (e.g. by an input tensor of the same shape in a new graph).
using StateTensorFn = std::function<void(const char* name, ggml_tensor*& t)>;

/// A type that can be the State of a Sequence.
template <class S>
concept SequenceState = std::copy_constructible<S> && requires(S s, const StateTensorFn& f) { s.visit_tensors(f); };

/// A module executed as prologue -> blocks -> epilogue (see the file comment).
/// Implementations are Blocks too (the same object owns the parameters).
template <class Inputs, SequenceState State, class Outputs>
class Sequence {
public:
    virtual ~Sequence() = default;

    /// Number of blocks (e.g. transformer layers).
    virtual int n_blocks() const = 0;
    /// Builds the prologue from the inputs; returns the state entering block 0.
    virtual State prologue(Ctx& c, const Inputs& in) const = 0;
    /// Builds block i (0 <= i < n_blocks()) on the state leaving block i-1.
    virtual State block(Ctx& c, int i, State s) const = 0;
    /// Builds the epilogue on the state leaving the last block.
    virtual Outputs epilogue(Ctx& c, State s) const = 0;

    /// The parameters of block i (one subtree), for per-block residency and byte counts.
    virtual const Block& block_params(int i) const = 0;

    /// Runs blocks [begin, end) on s. Throws Error(InvalidInput) on a bad range.
    State forward_range(Ctx& c, State s, int begin, int end) const {
        if (begin < 0 || end > n_blocks() || begin > end)
            fail(ErrorKind::InvalidInput, "block range [{}, {}) is outside the {} blocks of this module", begin, end, n_blocks());
        for (int i = begin; i < end; ++i) s = block(c, i, std::move(s));
        return s;
    }

    /// The whole module on one device: epilogue(blocks(prologue(in))).
    Outputs forward(Ctx& c, const Inputs& in) const { return epilogue(c, forward_range(c, prologue(c, in), 0, n_blocks())); }
};

}  // namespace easel::nn
