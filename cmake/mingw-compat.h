// Declarations that Debian 12's MinGW-w64 headers (mingw-w64 10) lack and ggml's CPU backend
// uses (ggml-cpu.c: thread power throttling, Windows 11); mingw-w64 11 has them. Force-included
// into ggml-cpu.c by cmake/ggml.cmake for MinGW builds only. Values from the Windows SDK's
// processthreadsapi.h.
#pragma once
#define WIN32_LEAN_AND_MEAN
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#ifndef THREAD_POWER_THROTTLING_CURRENT_VERSION
#define THREAD_POWER_THROTTLING_CURRENT_VERSION 1
#define THREAD_POWER_THROTTLING_EXECUTION_SPEED 0x1
typedef struct _THREAD_POWER_THROTTLING_STATE {
    ULONG Version;
    ULONG ControlMask;
    ULONG StateMask;
} THREAD_POWER_THROTTLING_STATE;
#endif
