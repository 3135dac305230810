/*
 * version.c — cmf_version(): the version of the library actually linked,
 * from the CMake project version (CMF_PROJECT_VERSION, set for this file
 * by src/CMakeLists.txt), so a program can compare it with the headers'
 * CMF_VERSION_STRING at run time.
 */
#include "cmf/core.h"

#ifndef CMF_PROJECT_VERSION
#error "CMF_PROJECT_VERSION must be defined by the build (src/CMakeLists.txt)"
#endif

const char *cmf_version(void) { return CMF_PROJECT_VERSION; }
