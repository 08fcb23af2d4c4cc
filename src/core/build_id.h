// Which easel build is running, for keys of on-disk caches: an entry written by another build
// (another version, another ggml, or the same version rebuilt from changed sources) must never be
// served, so that a stale cached result cannot hide a change (or a regression) in the code that
// would compute it.
#pragma once

#include <string>

namespace easel {

/// "easel <version> ggml <commit> build <id>": the version (CMake project version), the ggml
/// commit it was configured with, and the build's own identity: on ELF platforms the GNU build-id
/// note of the binary (or shared library) holding easel's code, a hash the linker computes over
/// its contents, so any change to the code linked into it changes it; elsewhere (or when the
/// linker wrote no note) the date and time this file was compiled. Computed once.
const std::string& build_identity();

}  // namespace easel
