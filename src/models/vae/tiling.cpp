#include "models/vae/tiling.h"

#include <vector>

namespace easel::vae {

void blend_v(const HostTensor& a, HostTensor& b, int64_t extent) {
    if (a.n != b.n || a.c != b.c || a.w != b.w)
        fail(ErrorKind::Internal, "blend_v: tiles {}x{}x{}x{} and {}x{}x{}x{} differ in N, C or W", a.n, a.c, a.h, a.w,
             b.n, b.c, b.h, b.w);
    extent = std::min({extent, a.h, b.h});
    for (int64_t n = 0; n < b.n; ++n)
        for (int64_t c = 0; c < b.c; ++c)
            for (int64_t y = 0; y < extent; ++y) {
                const float t = float(y) / float(extent);
                for (int64_t x = 0; x < b.w; ++x)
                    b.at(n, c, y, x) = a.at(n, c, a.h - extent + y, x) * (1.0f - t) + b.at(n, c, y, x) * t;
            }
}

void blend_h(const HostTensor& a, HostTensor& b, int64_t extent) {
    if (a.n != b.n || a.c != b.c || a.h != b.h)
        fail(ErrorKind::Internal, "blend_h: tiles {}x{}x{}x{} and {}x{}x{}x{} differ in N, C or H", a.n, a.c, a.h, a.w,
             b.n, b.c, b.h, b.w);
    extent = std::min({extent, a.w, b.w});
    for (int64_t n = 0; n < b.n; ++n)
        for (int64_t c = 0; c < b.c; ++c)
            for (int64_t y = 0; y < b.h; ++y)
                for (int64_t x = 0; x < extent; ++x) {
                    const float t = float(x) / float(extent);
                    b.at(n, c, y, x) = a.at(n, c, y, a.w - extent + x) * (1.0f - t) + b.at(n, c, y, x) * t;
                }
}

HostTensor tiled_apply(const HostTensor& in, int64_t in_tile, int64_t out_tile, float overlap,
                       const std::function<HostTensor(const HostTensor&)>& fn) {
    if (in_tile <= 0 || out_tile <= 0)
        fail(ErrorKind::InvalidInput, "tile sizes must be positive (got {} input, {} output pixels)", in_tile, out_tile);
    if (!(overlap >= 0.0f && overlap < 1.0f))
        fail(ErrorKind::InvalidInput, "tile overlap {} is outside [0, 1); use e.g. 0.25", overlap);
    // Same truncation as Python's int() of a positive float.
    const int64_t step = int64_t(double(in_tile) * (1.0 - double(overlap)));
    const int64_t blend = int64_t(double(out_tile) * double(overlap));
    const int64_t keep = out_tile - blend;
    if (step <= 0)
        fail(ErrorKind::InvalidInput, "tile of {} pixels with overlap {} leaves no step between tiles; use a larger tile",
             in_tile, overlap);

    std::vector<std::vector<HostTensor>> rows;
    for (int64_t y = 0; y < in.h; y += step) {
        std::vector<HostTensor> row;
        for (int64_t x = 0; x < in.w; x += step) row.push_back(fn(in.crop(y, x, in_tile, in_tile)));
        rows.push_back(std::move(row));
    }

    // Blend in place, in diffusers' order, then crop each tile to [:keep, :keep].
    std::vector<std::vector<HostTensor>> kept(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
        for (size_t j = 0; j < rows[i].size(); ++j) {
            HostTensor& t = rows[i][j];
            if (i > 0) blend_v(rows[i - 1][j], t, blend);
            if (j > 0) blend_h(rows[i][j - 1], t, blend);
            kept[i].push_back(t.crop(0, 0, keep, keep));
        }
    }

    // Concatenate: widths of a row add up along W, heights of the rows along H.
    int64_t H = 0, W = 0;
    for (auto& t : kept[0]) W += t.w;
    for (auto& r : kept) H += r[0].h;
    const HostTensor& t00 = kept[0][0];
    HostTensor out(t00.n, t00.c, H, W);
    int64_t y0 = 0;
    for (auto& r : kept) {
        int64_t x0 = 0;
        for (auto& t : r) {
            for (int64_t n = 0; n < t.n; ++n)
                for (int64_t c = 0; c < t.c; ++c)
                    for (int64_t y = 0; y < t.h; ++y)
                        for (int64_t x = 0; x < t.w; ++x) out.at(n, c, y0 + y, x0 + x) = t.at(n, c, y, x);
            x0 += t.w;
        }
        y0 += r[0].h;
    }
    return out;
}

}  // namespace easel::vae
