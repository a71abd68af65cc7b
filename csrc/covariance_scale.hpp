// The power-of-two scale of a low-precision covariance block (float16, bfloat16, float32 rows;
// csrc/cuda/covariance.cu), shared by the device code and its binding (so the rule is tested on the CPU).
//
// With m = max |x - block mean| over the block, the centred values are multiplied by
//   s = 2^-(ilogb(m) - 14)  when m >= 2^15,   s = 1 otherwise,
// so that m s lies in [2^14, 2^15): float16 centred values stay below 2^15 < 65504 (its largest
// finite value; without the scale a block whose values reach +-6e4 centres to about 1.1e5 = inf), a
// product of two is below 2^30 and a float32 sum of 16,384 of them below 2^44, far from float32's
// overflow. s is a power of two, so scaling is exact wherever the result is a normal number, and the
// float64 merge undoes it exactly (multiplying the block's Gram by 1 / s^2). Blocks with m < 2^15 are
// left as they are (s = 1): their values need no scaling and keep their rounding unchanged.
#pragma once

#include <cmath>

#include "host_device.hpp"

namespace dihal {

constexpr double kCovarianceScaleFrom = 32768.0;  // 2^15

DIHAL_HOST_DEVICE double covariance_block_scale(double max_abs) {
  return max_abs >= kCovarianceScaleFrom ? ldexp(1.0, -(ilogb(max_abs) - 14)) : 1.0;
}

}  // namespace dihal
