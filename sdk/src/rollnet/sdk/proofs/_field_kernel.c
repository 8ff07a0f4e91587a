/* Compiled interpolation over GF(65497) for TOPLOC commitments (optional; see _field.py).
 *
 * The same Lagrange/power-sum method as the numpy code in _field.py, one window at a time and
 * bit-identical to it (exact arithmetic: every intermediate is an integer below 2**53 held in a
 * double, reduced modulo p by a floor-multiply and two corrections):
 *
 *   M(z) = prod_j (z - x_j)                      (coefficients m_0..m_k, m_k = 1)
 *   w_j  = y_j / M'(x_j)
 *   s_e  = sum_j w_j x_j^e                        (e < k)
 *   c_i  = sum_e s_e m_{i+1+e}                    (the interpolant's coefficients, i < k)
 *
 * Built by sdk/hatch_build.py when a C compiler is available and loaded with ctypes; without it
 * the numpy code runs. The library calls no Python API, so ctypes releases the GIL during a call.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_K 256
#define P 65497.0

static const double INV_P = 1.0 / 65497.0;

/* v mod P for an integer 0 <= v < 2**52 held in a double. */
static inline double reduce(double v) {
    double r = v - floor(v * INV_P) * P;
    r = r < 0.0 ? r + P : r;
    return r >= P ? r - P : r;
}

#if defined(ROLLNET_TARGET_CLONES)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

/* The caller's scratch (one per calling thread): SCRATCH_DOUBLES doubles, holding the power
 * table powers[e * k + j] = x_j^e and then top-k candidates. Not static: a thread-local array in
 * a shared library is reached through the TLS resolver, which cost ~20% here. */
#define SCRATCH_DOUBLES (MAX_K * MAX_K + 65536 / 2)

/* Coefficients of the degree < k interpolant through (x_j, y_j), 1 <= k <= MAX_K; x distinct
 * residues, y residues. Inlined into each clone of the entry points. */
static inline __attribute__((always_inline)) void interpolate_one(const double *x, const double *y,
                                                                 int64_t k, const int64_t *inverse,
                                                                 double *powers,
                                                                 double *coefficients) {
    double m[MAX_K + 1], next[MAX_K + 1], derivative[MAX_K], w[MAX_K], s[MAX_K];

    /* M(z), one factor (z - x_j) at a time, ping-ponging between two buffers. */
    double *cur = m, *nxt = next;
    cur[0] = 1.0;
    for (int64_t j = 0; j < k; j++) {
        const double c = x[j] == 0.0 ? 0.0 : P - x[j]; /* -x_j mod P */
        nxt[0] = reduce(c * cur[0]);
        for (int64_t i = 1; i <= j; i++) nxt[i] = reduce(cur[i - 1] + c * cur[i]);
        nxt[j + 1] = 1.0;
        double *t = cur;
        cur = nxt;
        nxt = t;
    }

    /* The power table, then M'(x_j) = sum_e (e + 1) m_{e+1} x_j^e. */
    for (int64_t j = 0; j < k; j++) {
        powers[j] = 1.0;
        derivative[j] = 0.0;
    }
    for (int64_t e = 1; e < k; e++) {
        const double *prev = powers + (e - 1) * k;
        double *row = powers + e * k;
        for (int64_t j = 0; j < k; j++) row[j] = reduce(prev[j] * x[j]);
    }
    for (int64_t e = 0; e < k; e++) {
        const double d = reduce((double)(e + 1) * cur[e + 1]);
        const double *row = powers + e * k;
        for (int64_t j = 0; j < k; j++) derivative[j] += d * row[j];
    }
    for (int64_t j = 0; j < k; j++) {
        const int64_t dv = (int64_t)reduce(derivative[j]);
        w[j] = reduce(y[j] * (double)inverse[dv]);
    }

    /* Weighted power sums s_e = sum_j w_j x_j^e. */
    for (int64_t e = 0; e < k; e++) {
        const double *row = powers + e * k;
        double t = 0.0;
        for (int64_t j = 0; j < k; j++) t += w[j] * row[j];
        s[e] = reduce(t);
    }

    /* c_i = sum_e s_e m_{i+1+e}. */
    for (int64_t i = 0; i < k; i++) {
        double t = 0.0;
        for (int64_t e = 0; i + 1 + e <= k; e++) t += s[e] * cur[i + 1 + e];
        coefficients[i] = reduce(t);
    }
}

int rollnet_scratch_doubles(void) { return SCRATCH_DOUBLES; }

#ifndef ROLLNET_KERNEL_SOURCE
#define ROLLNET_KERNEL_SOURCE ""
#endif
/* SHA-256 of this file as built (see hatch_build.py): the loader refuses a stale library. */
const char *rollnet_kernel_source(void) { return ROLLNET_KERNEL_SOURCE; }

CLONES int rollnet_interpolate(const int64_t *xs, const int64_t *ys, int64_t *out, int64_t batch,
                               int64_t k, const int64_t *inverse, double *scratch) {
    /* xs, ys, out: [batch, k] row-major; x distinct residues in [0, P), y residues in [0, P).
     * inverse: [P] table of multiplicative inverses; scratch: SCRATCH_DOUBLES doubles.
     * Returns 0, or -1 if k is out of range. */
    double x[MAX_K], y[MAX_K], c[MAX_K];
    if (k < 1 || k > MAX_K) return -1;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t j = 0; j < k; j++) {
            x[j] = (double)xs[b * k + j];
            y[j] = (double)ys[b * k + j];
        }
        interpolate_one(x, y, k, inverse, scratch, c);
        for (int64_t i = 0; i < k; i++) out[b * k + i] = (int64_t)c[i];
    }
    return 0;
}

/* Flat indices of the k largest-magnitude bf16 patterns of row[0..n), 0 < k < n, ties to the
 * lower index (the order toploc.top_k_indices defines), in ascending index order. A histogram of
 * exponents finds the exponent of the k-th largest, the candidates (that exponent or larger)
 * are gathered, and a histogram of their mantissas finds the exact threshold. */
static void top_k(const uint16_t *row, int64_t n, int64_t k, int32_t *candidates,
                  int64_t *chosen) {
    uint32_t exponents[4][256]; /* four interleaved copies: no stall on a repeated bin */
    uint32_t mantissas[128];
    memset(exponents, 0, sizeof exponents);
    memset(mantissas, 0, sizeof mantissas);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        exponents[0][(row[i] >> 7) & 0xFF]++;
        exponents[1][(row[i + 1] >> 7) & 0xFF]++;
        exponents[2][(row[i + 2] >> 7) & 0xFF]++;
        exponents[3][(row[i + 3] >> 7) & 0xFF]++;
    }
    for (; i < n; i++) exponents[0][(row[i] >> 7) & 0xFF]++;
    int64_t above = 0; /* patterns strictly above the threshold found so far */
    int bin = 255;
    for (;; bin--) {
        const int64_t count = (int64_t)exponents[0][bin] + exponents[1][bin] + exponents[2][bin] +
                              exponents[3][bin];
        if (above + count >= k) break;
        above += count;
    }
    const int lowest = bin << 7;
    int64_t found = 0;
    for (i = 0; i < n; i++) {
        candidates[found] = (int32_t)i;
        found += (row[i] & 0x7FFF) >= lowest;
    }
    for (int64_t c = 0; c < found; c++) {
        const int magnitude = row[candidates[c]] & 0x7FFF;
        if ((magnitude >> 7) == bin) mantissas[magnitude & 0x7F]++;
    }
    int sub = 127;
    while (above + mantissas[sub] < k) above += mantissas[sub--];
    const int threshold = lowest | sub;
    int64_t ties = k - above, taken = 0; /* patterns equal to the threshold, lowest index first */
    for (int64_t c = 0; c < found; c++) {
        const int magnitude = row[candidates[c]] & 0x7FFF;
        if (magnitude > threshold || (magnitude == threshold && ties-- > 0))
            chosen[taken++] = candidates[c];
    }
}

CLONES int rollnet_encode(const uint16_t *bits, int64_t batch, int64_t n, int64_t k,
                          const int64_t *inverse, double *scratch, uint8_t *out) {
    /* Commit rows bits[batch, n] of bf16 patterns, n < P (every flat index is its own residue, so
     * the modulus is P): out[batch, 2 + 2k] gets P then k coefficients, big-endian uint16.
     * Returns 0, or -1 if n or k is out of range. */
    int64_t chosen[MAX_K];
    double x[MAX_K], y[MAX_K], c[MAX_K];
    if (k < 1 || k > MAX_K || n < 1 || n >= 65497) return -1;
    const int64_t used = n < k ? n : k;
    for (int64_t b = 0; b < batch; b++) {
        const uint16_t *row = bits + b * n;
        uint8_t *proof = out + b * (2 + 2 * k);
        if (used == n) {
            for (int64_t j = 0; j < n; j++) chosen[j] = j;
        } else {
            top_k(row, n, used, (int32_t *)(scratch + MAX_K * MAX_K), chosen);
        }
        for (int64_t j = 0; j < used; j++) {
            x[j] = (double)chosen[j];
            y[j] = reduce((double)row[chosen[j]]);
        }
        interpolate_one(x, y, used, inverse, scratch, c);
        proof[0] = 65497 >> 8;
        proof[1] = 65497 & 0xFF;
        for (int64_t i = 0; i < k; i++) {
            const int value = i < used ? (int)c[i] : 0;
            proof[2 + 2 * i] = (uint8_t)(value >> 8);
            proof[3 + 2 * i] = (uint8_t)(value & 0xFF);
        }
    }
    return 0;
}

CLONES int rollnet_top_k(const uint16_t *bits, int64_t batch, int64_t n, int64_t k,
                         double *scratch, int64_t *out) {
    /* out[batch, k]: each row's top-k flat indices (toploc.top_k_indices' set), ascending.
     * 0 < k < n <= 65536. Returns 0, or -1 if out of range. */
    if (k < 1 || k >= n || n > 65536) return -1;
    for (int64_t b = 0; b < batch; b++)
        top_k(bits + b * n, n, k, (int32_t *)(scratch + MAX_K * MAX_K), out + b * k);
    return 0;
}

CLONES int rollnet_evaluate(const int64_t *coefficients, const int64_t *xs, int64_t *out,
                            int64_t batch, int64_t count, int64_t points) {
    /* out[b, j] = sum_e coefficients[b, e] * xs[b, j]^e mod P (Horner), for residues in [0, P).
     * Returns 0, or -1 if count or points is out of range. */
    double x[MAX_K], acc[MAX_K];
    if (count < 1 || points < 1 || points > MAX_K) return -1;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *c = coefficients + b * count;
        for (int64_t j = 0; j < points; j++) {
            x[j] = (double)xs[b * points + j];
            acc[j] = 0.0;
        }
        for (int64_t e = count - 1; e >= 0; e--) {
            const double ce = (double)c[e];
            for (int64_t j = 0; j < points; j++) acc[j] = reduce(acc[j] * x[j] + ce);
        }
        for (int64_t j = 0; j < points; j++) out[b * points + j] = (int64_t)acc[j];
    }
    return 0;
}
