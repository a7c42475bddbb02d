// The CPU kernels of an RMSNorm over a row whose columns may be split among tensor ranks
// (model.qk_norm: each token's whole q and whole k, whose heads the ranks split). Each kernel
// works on this rank's `width` columns of each of N rows, x's rows `x_stride` floats apart and y's
// (and dy's, dx's) `y_stride` apart; the per-row sums between them are summed over the group by
// the caller. y = w x r with r = 1 / sqrt(sum(x^2) / whole + eps) over the `whole` row.
#pragma once

namespace pipetrain {

// ss[t] = sum over this rank's columns of x^2 (the group then sums it).
void split_rms_squares(float* ss, const float* x, int N, int width, int x_stride);
// rstd[t] = 1 / sqrt(ss[t] / whole + eps); y = w x rstd.
void split_rms_forward(float* y, float* rstd, const float* x, const float* ss, const float* w, int N, int width,
                       int x_stride, int y_stride, int whole, float eps);
// dot[t] = sum over this rank's columns of w dy x (the group then sums it).
void split_rms_dots(float* dot, const float* dy, const float* x, const float* w, int N, int width, int x_stride,
                    int y_stride);
// dw[c] += sum_t dy x rstd (null: not wanted); then dx = rstd (w dy - x rstd^2 share dot / whole)
// (null: not wanted), in place where dx == dy. `share`: this rank's part of the dot's term where
// several ranks hold the same columns and each a part of dy (a key/value head several hold).
void split_rms_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd,
                        const float* dot, int N, int width, int x_stride, int y_stride, int whole, float share);

}  // namespace pipetrain
