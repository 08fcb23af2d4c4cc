// A restricted unpickler for PyTorch checkpoints (torch.save): it rebuilds only what tensor
// checkpoints hold and executes nothing.
//
// Python's pickle is a small stack machine whose GLOBAL / STACK_GLOBAL opcodes name any Python
// callable and whose REDUCE / NEWOBJ / BUILD opcodes call it: loading an untrusted pickle with
// pickle.load or torch.load(weights_only=False) runs whatever the file names (the classic
// `os.system` payload). This reader never calls anything. A global resolves only when it is in
// the allowed set below; it becomes an inert node whose REDUCE is interpreted here (building a
// tensor description, a dict, a tuple), and any other global, or REDUCE / NEWOBJ / BUILD on
// anything else, is refused with one message naming the global.
//
// Allowed globals (docs/formats.md "PyTorch checkpoints"):
//   collections.OrderedDict                         -> a dict
//   torch._utils._rebuild_tensor_v2 / _rebuild_tensor -> a tensor (storage, offset, size, stride)
//   torch._utils._rebuild_parameter[_with_state]     -> its tensor
//   torch._tensor._rebuild_from_type_v2              -> (with new_type torch.Tensor / Parameter) its tensor
//   torch.{Double,Float,Half,BFloat16,Long,Int,Short,Char,Byte,Bool,Untyped,Float8_e4m3fn,Float8_e5m2}Storage
//   (also torch.cuda.*Storage of old files)          -> storage types in persistent ids
//   torch.Size                                       -> a tuple
//   torch.<dtype> (torch.float32, torch.float16 ...)  -> an inert value
//   builtins.set / frozenset (__builtin__ too)       -> a list
//   _codecs.encode(str, 'latin1')                    -> bytes (protocol-2 pickles of bytes)
//   numpy.dtype, numpy.core.multiarray.scalar (numpy._core too) -> numbers (global_step ...)
//   pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint (and lightning.pytorch.*)
//                                                    -> an inert object (its state is kept, never run)
// Protocols 0 to 5 are read; EXT*, INST, OBJ, out-of-band buffers (protocol 5) are refused.
// Limits (each refusal one message): 4M nodes, memo indices anywhere in 32 bits (kept in a map),
// strings up to the bytes left, tensors of at most 8 dimensions.
#pragma once

#include "io/weight_index.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace easel::io::pickle {

/// One node of an unpickled object graph. Nodes live in Unpickled::nodes and refer to each other
/// by index, so shared references (the pickle memo) and cycles a hostile file may build cost no
/// ownership: traversals are depth-limited instead.
struct Node {
    enum class Kind : uint8_t {
        None, Bool, Int, BigInt, Float, String, Bytes, List, Tuple, Dict,
        Global,   ///< an allowed global (s = "module.name"), before or without a call
        Storage,  ///< a storage named by a persistent id (s = key)
        Tensor,   ///< a rebuilt tensor description (no data)
        Object,   ///< an inert object of an allowed class (s = class), or a numpy dtype
    };
    Kind kind = Kind::None;
    bool b = false;
    int64_t i = 0;       ///< Int; Storage: numel (elements); Tensor: storage offset (elements)
    double f = 0;        ///< Float
    std::string s;       ///< String (UTF-8), Bytes, BigInt (little-endian two's complement), Global / Object name, Storage key
    std::vector<uint32_t> items;  ///< List / Tuple items; Dict: key0, value0, key1, value1, ...; Object: state; Tensor: storage node
    DType dtype = DType::U8;      ///< Storage / Tensor element type
    std::string location;         ///< Storage: device location ("cpu", "cuda:0")
    std::vector<int64_t> size, stride;  ///< Tensor
};

/// The result of unpickle().
struct Unpickled {
    std::vector<Node> nodes;
    uint32_t root = 0;
    size_t consumed = 0;  ///< bytes up to and including the STOP opcode
    const Node& at(uint32_t i) const { return nodes.at(i); }
};

/// Largest number of nodes one pickle may create.
inline constexpr size_t kMaxNodes = 4u << 20;

/// Unpickles `data` (one pickle, up to its STOP) with the allowed set above. Persistent ids
/// (BINPERSID / PERSID) must be PyTorch storage ids ('storage', storage type, key, location,
/// numel[, view metadata None]); they become Storage nodes. `label` names the file in errors.
/// Throws Error(InvalidInput) for a refused global or opcode ("'FILE' is refused: it calls
/// os.system, which a tensor checkpoint never does; nothing in it was run"), a truncated or
/// malformed pickle, or a limit passed.
Unpickled unpickle(std::span<const uint8_t> data, const std::string& label);

/// One tensor found in a state dict.
struct FoundTensor {
    std::string name;
    uint32_t node = 0;  ///< the Tensor node
};

/// What select_state_dict() found.
struct StateDict {
    std::vector<FoundTensor> tensors;
    /// The wrapper key the tensors were taken from ("params_ema", "state_dict", ...) or "" when
    /// the root dict holds them.
    std::string wrapper;
    /// Simple values beside the tensors at the root (epoch, global_step ...) as text, by key.
    std::vector<std::pair<std::string, std::string>> scalars;
    /// Other wrapper keys present that were not used (e.g. "params" when "params_ema" was taken).
    std::vector<std::string> unused_wrappers;
};

/// Deepest nesting followed when collecting tensors.
inline constexpr int kMaxNesting = 64;

/// Finds the state dict in an unpickled checkpoint: when the root is a dict with one of the
/// wrapper keys params_ema, params, state_dict, model, module, model_state_dict, net, generator
/// (first found, in that order) whose value holds tensors, that value; else the root. Tensors are
/// collected from it depth-first with dotted names: dict values under string keys, list / tuple
/// items under their index; other values are skipped. Throws Error(InvalidInput) when the root
/// is not a dict, nothing holds a tensor, nesting passes kMaxNesting, or a name repeats.
StateDict select_state_dict(const Unpickled& u, const std::string& label);

}  // namespace easel::io::pickle
