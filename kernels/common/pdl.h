// Programmatic dependent launches (see pdl_launch.cuh), host side: whether kernel launches
// carry the attribute. Plain C++ so that host code can query (and initialise) it early.
#pragma once

namespace arbor::kernels {

// A GPU of compute capability 9 or later, device code built for sm_90 or later (a one-thread
// probe kernel checks), and ARBOR_PDL unset or not 0. Determined once per process, at the first
// call, which must not be inside a stream capture (it allocates and copies).
bool pdl_enabled();

}  // namespace arbor::kernels
