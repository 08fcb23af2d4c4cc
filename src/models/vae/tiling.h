// Tiled application of an image-to-image function with linear blending of the overlaps.
//
// The rule is diffusers' AutoencoderKL.tiled_decode / _tiled_encode
// (diffusers/models/autoencoders/autoencoder_kl.py):
//   step  = int(in_tile * (1 - overlap))      tile origins 0, step, 2*step, ... along H and W
//   blend = int(out_tile * overlap)           rows/columns cross-faded with the previous tile
//   keep  = out_tile - blend                  rows/columns each tile contributes
// Tiles are processed in row-major order; tile (i, j) is first blended with the (already
// blended) tile above it (blend_v), then with the one to its left (blend_h), then cropped to
// [:keep, :keep]; the crops are concatenated. blend_v(a, b, e): for y < e,
// b[y] = a[len(a) - e + y] * (1 - y/e) + b[y] * (y/e), with e = min(e, len(a), len(b)).
#pragma once

#include "models/vae/host_tensor.h"

#include <functional>

namespace easel::vae {

/// Blends the last rows of `a` into the first rows of `b`, in place (diffusers blend_v).
/// a, b: [N, C, *, W] with equal N, C, W. extent: rows, clipped to both heights.
void blend_v(const HostTensor& a, HostTensor& b, int64_t extent);
/// Same along columns (diffusers blend_h). a, b: [N, C, H, *] with equal N, C, H.
void blend_h(const HostTensor& a, HostTensor& b, int64_t extent);

/// Applies `fn` to tiles of `in` of in_tile x in_tile pixels and blends the outputs, whose tiles
/// are out_tile x out_tile pixels for a full input tile (out_tile / in_tile = the function's
/// scale: f for a decoder, 1/f for an encoder). `fn` must map a [N, C, h, w] tile to
/// [N, C', h*s, w*s]. Throws Error(InvalidInput) for non-positive sizes or an overlap outside
/// [0, 1) that leaves a step of zero pixels.
HostTensor tiled_apply(const HostTensor& in, int64_t in_tile, int64_t out_tile, float overlap,
                       const std::function<HostTensor(const HostTensor&)>& fn);

}  // namespace easel::vae
