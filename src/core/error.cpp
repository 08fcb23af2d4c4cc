#include "core/error.h"

namespace easel {

const char* error_kind_name(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::InvalidInput: return "invalid input";
        case ErrorKind::ModelMismatch: return "model mismatch";
        case ErrorKind::OutOfMemory: return "out of memory";
        case ErrorKind::Io: return "I/O error";
        case ErrorKind::Unsupported: return "unsupported";
        case ErrorKind::Internal: return "internal error";
    }
    return "error";
}

}  // namespace easel
