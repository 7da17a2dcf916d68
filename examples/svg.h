/* svg.h: a small SVG writer for the examples, header-only.
 *
 * svg_heatmaps writes matrices of values in [0, 1] (attention weights, one
 * panel per head) as grids of colored cells with row and column labels and a
 * color bar; svg_lineplot writes x/y series (a training-loss curve) with
 * round-numbered ticks, optionally on a log y axis. Both return 0, or -1 with
 * svg_error() naming the path and the reason (strerror of errno). They
 * allocate nothing but the FILE. Text is escaped for XML; labels are expected
 * in UTF-8 (the examples' are ASCII).
 */
#ifndef NB_EXAMPLES_SVG_H
#define NB_EXAMPLES_SVG_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define SVG_ERRLEN 4608 /* room for a whole path */

/* inline only so that a program using part of this file gets no unused-function warnings */
static inline char *svg_errbuf(void) {
    static char buf[SVG_ERRLEN];
    return buf;
}

static inline const char *svg_error(void) { return svg_errbuf(); }

static inline FILE *svg_open(const char *path, double width, double height) {
    errno = 0;
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(svg_errbuf(), SVG_ERRLEN, "cannot write %s: %s", path, strerror(errno));
        return NULL;
    }
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            width, height, width, height);
    return f;
}

static inline int svg_close(FILE *f, const char *path) {
    fputs("</svg>\n", f);
    int err = ferror(f) ? (errno ? errno : EIO) : 0;
    if (fclose(f) != 0 && !err) err = errno ? errno : EIO;
    if (!err) return 0;
    snprintf(svg_errbuf(), SVG_ERRLEN, "cannot write %s: %s", path, strerror(err));
    return -1;
}

static inline void svg_escaped(FILE *f, const char *s) {
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default: fputc(c < 0x20 && c != '\t' && c != '\n' ? '?' : c, f); /* invalid in XML */
        }
    }
}

/* <text x= y= attrs>s</text>; attrs is raw markup (may be NULL) */
static inline void svg_text(FILE *f, double x, double y, const char *attrs, const char *s) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\"%s%s>", x, y, attrs ? " " : "", attrs ? attrs : "");
    svg_escaped(f, s);
    fputs("</text>\n", f);
}

/* ColorBrewer "Blues": white (0) to dark blue (1), interpolated in sRGB as
 * SVG gradients are, so the color bar shows exactly the cell colors. */
static inline void svg_color(double v, char out[8]) {
    static const unsigned char a[9][3] = {{247, 251, 255}, {222, 235, 247}, {198, 219, 239},
                                          {158, 202, 225}, {107, 174, 214}, {66, 146, 198},
                                          {33, 113, 181},  {8, 81, 156},    {8, 48, 107}};
    if (isnan(v)) {
        memcpy(out, "#d62728", 8); /* red: a NaN must not pass for a weight */
        return;
    }
    double t = (v < 0 ? 0 : v > 1 ? 1 : v) * 8;
    int i = t >= 8 ? 7 : (int)t;
    t -= i;
    int c[3];
    for (int k = 0; k < 3; k++) c[k] = (int)lround(a[i][k] + t * (a[i + 1][k] - a[i][k]));
    snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}

/* ---------------------------------------------------------------- heatmaps */
typedef struct svg_heatmap_spec {
    const char *title, *subtitle;    /* subtitle may be NULL */
    const char *row_axis, *col_axis; /* what the rows and columns are, or NULL */
    const char *panel_name;          /* panel k is titled "<panel_name> <k>" ("panel" if NULL) */
    int panels, rows, cols;
    const double *values;          /* panels * rows * cols, row-major per panel, in [0, 1] */
    const char *const *row_labels; /* rows entries (left), or NULL */
    const char *const *col_labels; /* cols entries (top), or NULL */
} svg_heatmap_spec;

typedef struct {
    double cell, font, left, top, pw, ph, header; /* px; left, top: label space in a panel */
    int gcols, grows;                             /* panels per row, rows of panels */
    bool vertical;                                /* column labels rotated */
} svg_heat_layout;

static inline double svg_max_len(const char *const *labels, int n) {
    size_t m = 0;
    for (int i = 0; labels && i < n; i++)
        if (labels[i] && strlen(labels[i]) > m) m = strlen(labels[i]);
    return (double)m;
}

static inline double svg_clamp(double v, double lo, double hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

static inline svg_heat_layout svg_heat_layout_of(const svg_heatmap_spec *s) {
    svg_heat_layout l;
    int big = s->rows > s->cols ? s->rows : s->cols;
    l.cell = svg_clamp(floor(288.0 / big), 3, 24);
    l.font = svg_clamp(floor(l.cell * 0.5), 5, 11);
    double glyph = 0.62 * l.font; /* average width of a sans-serif glyph */
    double colw = svg_max_len(s->col_labels, s->cols) * glyph;
    l.vertical = colw > l.cell - 2;
    l.left = s->row_labels ? ceil(svg_max_len(s->row_labels, s->rows) * glyph) + 8 : 4;
    l.top = l.font + 10 + (s->col_labels ? ceil(l.vertical ? colw + 2 : l.font) + 4 : 0);
    l.pw = l.left + s->cols * l.cell + 24;
    l.ph = l.top + s->rows * l.cell + 16;
    l.gcols = (int)ceil(sqrt((double)s->panels));
    l.grows = (s->panels + l.gcols - 1) / l.gcols;
    l.header = 34 + (s->subtitle ? 18 : 0) + (s->row_axis || s->col_axis ? 18 : 0);
    return l;
}

static inline void svg_heat_labels(FILE *f, const svg_heatmap_spec *s, const svg_heat_layout *l,
                                   double gx, double gy) {
    char at[96];
    for (int c = 0; s->col_labels && c < s->cols; c++) {
        double x = gx + (c + 0.5) * l->cell, y = gy - 4;
        if (l->vertical) {
            x += 0.35 * l->font;
            snprintf(at, sizeof at, "transform=\"rotate(-90 %.1f %.1f)\"", x, y);
        } else {
            snprintf(at, sizeof at, "text-anchor=\"middle\"");
        }
        svg_text(f, x, y, at, s->col_labels[c] ? s->col_labels[c] : "");
    }
    for (int r = 0; s->row_labels && r < s->rows; r++)
        svg_text(f, gx - 4, gy + (r + 0.5) * l->cell + 0.35 * l->font, "text-anchor=\"end\"",
                 s->row_labels[r] ? s->row_labels[r] : "");
}

static inline void svg_heat_panel(FILE *f, const svg_heatmap_spec *s, const svg_heat_layout *l,
                                  int k, double x0, double y0) {
    double gx = round(x0 + l->left), gy = round(y0 + l->top), w = s->cols * l->cell;
    char name[80], at[96], color[8];
    snprintf(name, sizeof name, "%s %d", s->panel_name ? s->panel_name : "panel", k);
    snprintf(at, sizeof at, "text-anchor=\"middle\" font-weight=\"bold\" font-size=\"%.0f\"",
             l->font + 1);
    svg_text(f, gx + w / 2, y0 + l->font + 2, at, name);
    fprintf(f, "<g font-size=\"%.0f\" fill=\"#333\">\n", l->font);
    svg_heat_labels(f, s, l, gx, gy);
    fputs("</g>\n", f);
    svg_color(0, color);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"%s\"/>\n", gx,
            gy, w, s->rows * l->cell, color);
    const double *v = s->values + (size_t)k * (size_t)s->rows * (size_t)s->cols;
    for (int r = 0; r < s->rows; r++)
        for (int c = 0; c < s->cols; c++) {
            double x = v[(size_t)r * (size_t)s->cols + (size_t)c];
            if (x < 0.0005) continue; /* the background already has the color of 0 */
            svg_color(x, color);
            fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"%s\">"
                       "<title>%.3f</title></rect>\n",
                    gx + c * l->cell, gy + r * l->cell, l->cell, l->cell, color, x);
        }
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"#888\" stroke-width=\"0.5\"/>\n",
            gx, gy, w, s->rows * l->cell);
}

static inline void svg_colorbar(FILE *f, double x, double y, double h) {
    char color[8];
    fputs("<defs><linearGradient id=\"colorbar\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n", f);
    for (int i = 0; i <= 8; i++) {
        svg_color(i / 8.0, color);
        fprintf(f, "<stop offset=\"%.3f\" stop-color=\"%s\"/>\n", i / 8.0, color);
    }
    fputs("</linearGradient></defs>\n", f);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"%.0f\" fill=\"url(#colorbar)\" "
               "stroke=\"#888\" stroke-width=\"0.5\"/>\n",
            x, y, h);
    fputs("<g font-size=\"10\" fill=\"#333\">\n", f);
    svg_text(f, x + 16, y + 4, NULL, "1");
    svg_text(f, x + 16, y + h / 2 + 4, NULL, "0.5");
    svg_text(f, x + 16, y + h + 4, NULL, "0");
    fputs("</g>\n", f);
}

static inline void svg_heat_header(FILE *f, const svg_heatmap_spec *s) {
    double y = 22;
    svg_text(f, 12, y, "font-size=\"15\" font-weight=\"bold\"", s->title ? s->title : "");
    if (s->subtitle) svg_text(f, 12, y += 18, "font-size=\"12\"", s->subtitle);
    if (!s->row_axis && !s->col_axis) return;
    fprintf(f, "<text x=\"12\" y=\"%.0f\" font-size=\"12\" fill=\"#555\">rows: ", y + 18);
    svg_escaped(f, s->row_axis ? s->row_axis : "-");
    fputs("; columns: ", f);
    svg_escaped(f, s->col_axis ? s->col_axis : "-");
    fputs("</text>\n", f);
}

static inline int svg_heatmaps(const char *path, const svg_heatmap_spec *s) {
    if (s->panels < 1 || s->rows < 1 || s->cols < 1 || !s->values) {
        snprintf(svg_errbuf(), SVG_ERRLEN, "%s: nothing to draw (%d panels of %d x %d)", path,
                 s->panels, s->rows, s->cols);
        return -1;
    }
    svg_heat_layout l = svg_heat_layout_of(s);
    double bar_h = svg_clamp(s->rows * l.cell, 60, 240), grid_w = 12 + l.gcols * l.pw;
    FILE *f = svg_open(path, grid_w + 44, l.header + l.grows * l.ph + 4);
    if (!f) return -1;
    svg_heat_header(f, s);
    for (int k = 0; k < s->panels; k++)
        svg_heat_panel(f, s, &l, k, 12 + (k % l.gcols) * l.pw, l.header + (k / l.gcols) * l.ph);
    svg_colorbar(f, grid_w, l.header + l.top, bar_h);
    return svg_close(f, path);
}

/* --------------------------------------------------------------- line plots */
typedef struct svg_series {
    const char *label;   /* legend entry, or NULL */
    const double *x, *y; /* n points; non-finite ones are left out */
    int64_t n;
    const char *color; /* e.g. "#08519c" */
    double width;      /* stroke width, px */
} svg_series;

typedef struct svg_plot_spec {
    const char *title, *x_label, *y_label;
    const svg_series *series;
    int n_series;
    bool log_y;              /* log10 y axis; points with y <= 0 are left out */
    const double *vlines;    /* x of dashed vertical lines (e.g. epoch ends), or NULL */
    int64_t n_vlines;
    const char *vline_label; /* their legend entry, or NULL */
} svg_plot_spec;

typedef struct {
    double x0, x1, y0, y1;        /* data range; y in log10 units when log_y */
    double left, top, w, h;       /* plot area, px */
    bool log_y;
} svg_axes;

static inline bool svg_point_ok(const svg_axes *a, double x, double y) {
    return isfinite(x) && isfinite(y) && (!a->log_y || y > 0);
}

static inline double svg_px(const svg_axes *a, double x) {
    return a->left + (x - a->x0) / (a->x1 - a->x0) * a->w;
}

static inline double svg_py(const svg_axes *a, double y) {
    double v = a->log_y ? log10(y) : y;
    return a->top + a->h - (v - a->y0) / (a->y1 - a->y0) * a->h;
}

/* the data range over every series, padded; [0, 1] when there is no point */
static inline void svg_axes_range(svg_axes *a, const svg_plot_spec *s) {
    a->x0 = a->y0 = INFINITY;
    a->x1 = a->y1 = -INFINITY;
    for (int k = 0; k < s->n_series; k++)
        for (int64_t i = 0; i < s->series[k].n; i++) {
            double x = s->series[k].x[i], y = s->series[k].y[i];
            if (!svg_point_ok(a, x, y)) continue;
            y = a->log_y ? log10(y) : y;
            a->x0 = fmin(a->x0, x), a->x1 = fmax(a->x1, x);
            a->y0 = fmin(a->y0, y), a->y1 = fmax(a->y1, y);
        }
    if (a->x0 > a->x1) a->x0 = a->y0 = 0, a->x1 = a->y1 = 1;
    if (a->x1 - a->x0 < 1e-12) a->x0 -= 0.5, a->x1 += 0.5;
    if (a->y1 - a->y0 < 1e-12) a->y0 -= 0.5, a->y1 += 0.5;
    double pad = 0.04 * (a->y1 - a->y0);
    a->y0 -= pad, a->y1 += pad;
}

/* 1, 2 or 5 times a power of ten, near span / target */
static inline double svg_nice_step(double span, int target) {
    double raw = span / target, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static inline void svg_tick(FILE *f, const svg_axes *a, bool vertical, double at, double value) {
    char label[32];
    snprintf(label, sizeof label, "%g", value);
    if (vertical) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#e3e3e3\"/>\n",
                at, a->top, at, a->top + a->h);
        svg_text(f, at, a->top + a->h + 15, "text-anchor=\"middle\"", label);
    } else {
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n",
                a->left, at, a->left + a->w, at);
        svg_text(f, a->left - 6, at + 4, "text-anchor=\"end\"", label);
    }
}

static inline void svg_linear_ticks(FILE *f, const svg_axes *a, bool x_axis) {
    double lo = x_axis ? a->x0 : a->y0, hi = x_axis ? a->x1 : a->y1;
    double step = svg_nice_step(hi - lo, x_axis ? 8 : 6);
    for (double k = ceil(lo / step - 1e-9); k * step <= hi + 1e-9 * step; k++) {
        double v = fabs(k) < 0.5 ? 0 : k * step; /* no "-0" */
        svg_tick(f, a, x_axis, x_axis ? svg_px(a, v) : svg_py(a, v), v);
    }
}

/* decades; also 2 and 5 times them over a few decades, every digit within
 * one; draws them when draw, returns how many there are */
static inline int svg_log_ticks_at(FILE *f, const svg_axes *a, bool draw) {
    static const double some[] = {1, 2, 5}, all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    double span = a->y1 - a->y0;
    const double *m = span <= 1 ? all : some;
    int nm = span <= 1 ? 9 : span <= 3.5 ? 3 : 1, count = 0;
    for (double d = floor(a->y0); d <= ceil(a->y1); d++)
        for (int i = 0; i < nm; i++) {
            double e = d + log10(m[i]);
            if (e < a->y0 || e > a->y1) continue;
            if (draw) svg_tick(f, a, false, svg_py(a, pow(10, e)), m[i] * pow(10, d));
            count++;
        }
    return count;
}

static inline void svg_log_ticks(FILE *f, const svg_axes *a) {
    if (svg_log_ticks_at(f, a, false) >= 2) {
        svg_log_ticks_at(f, a, true);
        return;
    }
    /* a narrow range (say 0.31 to 0.37): round numbers within it */
    double lo = pow(10, a->y0), hi = pow(10, a->y1), step = svg_nice_step(hi - lo, 5);
    for (double k = ceil(lo / step - 1e-9); k * step <= hi + 1e-9 * step; k++)
        svg_tick(f, a, false, svg_py(a, k * step), k * step);
}

/* A polyline; beyond 3 points per pixel column each column keeps its min and max. */
static inline void svg_polyline(FILE *f, const svg_axes *a, const svg_series *s) {
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%g\" "
               "stroke-linejoin=\"round\" points=\"",
            s->color ? s->color : "#08519c", s->width > 0 ? s->width : 1.5);
    bool thin = s->n > 3 * (int64_t)a->w;
    long col = LONG_MIN;
    double lo = 0, hi = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (!svg_point_ok(a, s->x[i], s->y[i])) continue;
        double px = svg_px(a, s->x[i]), py = svg_py(a, s->y[i]);
        if (!thin) {
            fprintf(f, "%.1f,%.1f ", px, py);
        } else if (lround(px) != col) {
            if (col != LONG_MIN) fprintf(f, "%ld,%.1f %ld,%.1f ", col, lo, col, hi);
            col = lround(px), lo = hi = py;
        } else {
            lo = fmin(lo, py), hi = fmax(hi, py);
        }
    }
    if (thin && col != LONG_MIN) fprintf(f, "%ld,%.1f %ld,%.1f ", col, lo, col, hi);
    fputs("\"/>\n", f);
}

static inline void svg_legend_entry(FILE *f, const svg_axes *a, int i, const char *label,
                                    const char *style) {
    double x = a->left + a->w - 190, y = a->top + 16 + 16 * i;
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" %s/>\n", x, y - 4, x + 22,
            y - 4, style);
    svg_text(f, x + 28, y, NULL, label);
}

static inline void svg_legend(FILE *f, const svg_axes *a, const svg_plot_spec *s) {
    char style[96];
    int n = 0;
    for (int k = 0; k < s->n_series; k++) n += s->series[k].label != NULL;
    n += s->vline_label && s->n_vlines > 0;
    if (!n) return;
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"184\" height=\"%d\" fill=\"white\" "
               "fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n",
            a->left + a->w - 196, a->top + 4, 16 * n + 8);
    int i = 0;
    for (int k = 0; k < s->n_series; k++) {
        if (!s->series[k].label) continue;
        snprintf(style, sizeof style, "stroke=\"%s\" stroke-width=\"%g\"",
                 s->series[k].color ? s->series[k].color : "#08519c",
                 s->series[k].width > 0 ? s->series[k].width : 1.5);
        svg_legend_entry(f, a, i++, s->series[k].label, style);
    }
    if (s->vline_label && s->n_vlines > 0)
        svg_legend_entry(f, a, i, s->vline_label, "stroke=\"#aaa\" stroke-dasharray=\"3,3\"");
}

static inline void svg_plot_frame(FILE *f, const svg_axes *a, const svg_plot_spec *s) {
    svg_text(f, a->left, 24, "font-size=\"15\" font-weight=\"bold\"", s->title ? s->title : "");
    fputs("<g font-size=\"11\" fill=\"#333\">\n", f);
    svg_linear_ticks(f, a, true);
    if (a->log_y) svg_log_ticks(f, a);
    else svg_linear_ticks(f, a, false);
    fputs("</g>\n<g font-size=\"12\">\n", f);
    svg_text(f, a->left + a->w / 2, a->top + a->h + 38, "text-anchor=\"middle\"",
             s->x_label ? s->x_label : "");
    char at[96];
    double x = a->left - 52, y = a->top + a->h / 2;
    snprintf(at, sizeof at, "text-anchor=\"middle\" transform=\"rotate(-90 %.0f %.0f)\"", x, y);
    svg_text(f, x, y, at, s->y_label ? s->y_label : "");
    fputs("</g>\n", f);
    for (int64_t i = 0; i < s->n_vlines; i++) {
        double x = svg_px(a, s->vlines[i]);
        if (!isfinite(x) || x < a->left || x > a->left + a->w) continue;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#aaa\" "
                   "stroke-dasharray=\"3,3\"/>\n",
                x, a->top, x, a->top + a->h);
    }
}

static inline int svg_lineplot(const char *path, const svg_plot_spec *s) {
    svg_axes a = {.left = 76, .top = 40, .w = 660, .h = 340, .log_y = s->log_y};
    svg_axes_range(&a, s);
    FILE *f = svg_open(path, a.left + a.w + 24, a.top + a.h + 56);
    if (!f) return -1;
    svg_plot_frame(f, &a, s);
    for (int k = 0; k < s->n_series; k++) svg_polyline(f, &a, &s->series[k]);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"#333\"/>\n",
            a.left, a.top, a.w, a.h);
    fputs("<g font-size=\"11\">\n", f);
    svg_legend(f, &a, s);
    fputs("</g>\n", f);
    return svg_close(f, path);
}

#endif /* NB_EXAMPLES_SVG_H */
