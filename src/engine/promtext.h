/* promtext: a parser of the Prometheus text exposition format 0.0.4.
 *
 * Pure: bytes in, one callback per sample out; no I/O, no clock, no
 * allocation, no globals.  Each line is
 *
 *     name [ "{" label="value" { "," label="value" } [ "," ] "}" ] value [ timestamp ]
 *
 * with blanks (spaces, tabs) between the tokens.  Tolerated and skipped:
 * "#" lines (# HELP, # TYPE, any comment), blank lines, a '\r' before the
 * '\n' (CRLF), a last line without '\n'.  A line has no length limit (it is
 * parsed where it lies, never copied into a fixed buffer).
 *
 * Values: what strtod() reads in the C locale, including NaN, +Inf, -Inf,
 * Inf and exponents; the whole token must be consumed.  Timestamps: an
 * optional signed 64-bit integer (milliseconds).  Label values are
 * unescaped as the format says (\\ -> \, \" -> ", \n -> newline); any
 * other backslash pair is kept as it is, as Prometheus does.
 *
 * Hostile input costs linear time and no memory: a line with more than
 * KVB_PROM_MAX_LABELS labels, a name or label value longer than its cap, a
 * bad name, an unterminated label set, a value that is not a number, or
 * anything left after the timestamp makes the line malformed: it is
 * counted and skipped, and parsing goes on with the next line.
 *
 * Ownership: kvb_prom_parse() unescapes label values IN PLACE, so the text
 * is writable and belongs to the caller; every pointer in a sample points
 * into it and is valid during the callback only (the labels array is the
 * parser's).  The text needs no terminating NUL.
 */
#ifndef KVB_PROMTEXT_H
#define KVB_PROMTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVB_PROM_MAX_LABELS 64         /* labels on one sample */
#define KVB_PROM_MAX_NAME 1024         /* bytes of a metric or label name */
#define KVB_PROM_MAX_LABEL_VALUE 65536 /* bytes of one label value (escaped) */
#define KVB_PROM_MAX_NUMBER 64         /* bytes of a value or timestamp token */

struct kvb_prom_label {
    const char *name;
    size_t name_len;
    const char *value; /* unescaped */
    size_t value_len;
};

struct kvb_prom_sample {
    const char *name; /* e.g. "vllm:kv_cache_usage_perc" or "x_bucket" */
    size_t name_len;
    const struct kvb_prom_label *labels; /* in the order of the line */
    size_t n_labels;
    double value;
    bool has_timestamp;
    int64_t timestamp_ms;
};

struct kvb_prom_stats {
    uint64_t lines;     /* every line, blank and comment lines included */
    uint64_t samples;   /* lines handed to the callback */
    uint64_t comments;  /* "#" lines */
    uint64_t malformed; /* lines skipped as malformed */
};

/* Called once per well-formed sample line; a non-zero return stops the
 * parse, and kvb_prom_parse() returns that value. */
typedef int (*kvb_prom_cb)(void *ctx, const struct kvb_prom_sample *s);

/* Parse text[0..len).  `stats` (may be NULL) is zeroed first, then counted.
 * Returns 0 when the whole text was read (malformed lines do not make it
 * fail), the callback's non-zero value when it stopped the parse, or
 * -EINVAL when text is NULL with len > 0 or cb is NULL. */
int kvb_prom_parse(char *text, size_t len, kvb_prom_cb cb, void *ctx, struct kvb_prom_stats *stats);

/* The label called `name` in s, or NULL. */
const struct kvb_prom_label *kvb_prom_label(const struct kvb_prom_sample *s, const char *name);

/* s's name equals the NUL-terminated `name`. */
bool kvb_prom_name_is(const struct kvb_prom_sample *s, const char *name);

#endif
