// Tiled upscaling with overlapping tiles, feathered and normalised so that no seam shows.
//
// Along each axis the tiles are `tile` pixels long (the whole axis when it is shorter), the first
// at 0 and the last flush with the end, evenly spread so that neighbours overlap by at least
// `overlap` pixels (origins multiples of `align`, the network's pixel-unshuffle factor). Every
// tile is upscaled by the network and its output weighted: at an edge it shares with a neighbour
// that overlaps it by v input pixels, the weight is 0 over the outer v/4 (the pixels whose
// receptive field the tile cuts off most), rises linearly over the next v/2 and is 1 beyond; the
// weight of a pixel is the product of its row and column weights. The image is sum(w * tile) /
// sum(w). In an overlap the two neighbours' ramps are mirror images, so the weights already sum
// to one there; the normalisation covers corners and uneven overlaps. A pixel is thus taken only
// from tiles in which it lies at least overlap/4 input pixels from a cut edge: a network whose
// receptive field reaches no further gives the whole-image result exactly (SRVGGNetCompact: the
// number of its convs, esrgan::context_pixels), and a deep one (RRDBNet) differs from it only
// through its far-reaching tail (tests/unit/esrgan_test.cpp measures both).
#pragma once

#include "models/vae/host_tensor.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace easel::esrgan {

/// The tile origins along an axis of `length` pixels: {0} when length <= tile, else n =
/// ceil((length - overlap) / (tile - overlap)) origins from 0 to length - tile, evenly spread and
/// rounded down to multiples of `align`. Throws Error(InvalidInput) when tile <= overlap, a size is
/// not positive, or tile / length are not multiples of align.
std::vector<int64_t> tile_origins(int64_t length, int64_t tile, int64_t overlap, int64_t align = 1);

/// The overlap used with a tile of `tile` pixels when none is given: the larger of a quarter of the
/// tile, 16 pixels and 4 x `context` (so that the cut-off quarter covers the network's context,
/// esrgan::context_pixels), at most half the tile, rounded down to a multiple of `align`.
int64_t default_overlap(int64_t tile, int64_t align = 1, int64_t context = 0);

/// Upscales `in` ([1, C, H, W]) by `scale` through `fn` (a [1, C, h, w] tile -> [1, C', h*scale,
/// w*scale]) in tiles as the file comment describes; `tile` <= 0 or not smaller than the image runs
/// fn once on the whole image. `on_tile(done, total)` is called after each tile when given.
/// Throws Error(InvalidInput) for bad sizes, Error(Internal) when fn returns the wrong shape.
vae::HostTensor tiled_upscale(const vae::HostTensor& in, int64_t tile, int64_t overlap, int scale, int64_t align,
                              const std::function<vae::HostTensor(const vae::HostTensor&)>& fn,
                              const std::function<void(int, int)>& on_tile = {});

/// Pads [N, C, H, W] at the bottom and right to multiples of `m` by reflection (numpy's 'reflect':
/// the edge pixel is not repeated; 'edge' for a side of one pixel), as Real-ESRGAN pads the input
/// of its pixel-unshuffle models. Returns the input unchanged when nothing is needed.
vae::HostTensor pad_reflect_to_multiple(const vae::HostTensor& in, int64_t m);

}  // namespace easel::esrgan
