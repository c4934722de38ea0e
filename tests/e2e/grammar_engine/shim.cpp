// The pinned llama.cpp grammar engine, driven at code-point level (vocab = nullptr, as llama.cpp's
// own tests/test-grammar-integration.cpp drives it), for the truth test and the grammar-cost bench.
//
// What the engine allows next is read from its own state: after each accepted code point, the
// union of the character sets at the top of every pushdown stack (decoded the way
// llama_grammar_match_char reads CHAR / CHAR_NOT / CHAR_ALT / CHAR_RNG_UPPER / CHAR_ANY), and
// whether some stack is empty (the answer may end here). Every character is fed through
// llama_grammar_accept; a walk picks a random allowed code point, so every finished sample is a
// string the engine admits. Probes check the reading both ways: a code point outside the read
// set must leave no stack (the engine rejects it), a code point inside must leave one.
//
// Built by tests/e2e/grammar_engine/__init__.py against the headers of the tree the server was
// built from, linked to its libllama (rpath). Every entry point is extern "C" and catches every
// C++ exception: errors come back as a return code and a message.

#include "llama-grammar.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr uint32_t MAX_CP = 0x10FFFF;
constexpr uint32_t SUR_LO = 0xD800;
constexpr uint32_t SUR_HI = 0xDFFF;

struct Range {
    uint32_t lo;
    uint32_t hi;
};

std::string g_log;  // the engine's log lines while parsing (why a grammar was refused)

void log_cb(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_CONT) {
        if (g_log.size() < 4096) {
            g_log += text;
        }
    }
}

void set_err(char * err, size_t cap, const std::string & msg) {
    if (err == nullptr || cap == 0) {
        return;
    }
    size_t n = std::min(cap - 1, msg.size());
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
}

void normalize(std::vector<Range> & rs) {
    std::vector<Range> keep;
    for (const auto & r : rs) {
        if (r.lo <= r.hi) {
            keep.push_back({r.lo, std::min(r.hi, MAX_CP)});
        }
    }
    std::sort(keep.begin(), keep.end(), [](const Range & a, const Range & b) { return a.lo < b.lo; });
    rs.clear();
    for (const auto & r : keep) {
        if (r.lo > MAX_CP) {
            continue;
        }
        if (!rs.empty() && r.lo <= rs.back().hi + 1) {
            rs.back().hi = std::max(rs.back().hi, r.hi);
        } else {
            rs.push_back(r);
        }
    }
}

// The code points the char element at pos matches, as llama_grammar_match_char decides it.
void element_ranges(const llama_grammar_element * pos, std::vector<Range> & out) {
    const bool positive = pos->type == LLAMA_GRETYPE_CHAR || pos->type == LLAMA_GRETYPE_CHAR_ANY;
    std::vector<Range> listed;
    do {
        if (pos[1].type == LLAMA_GRETYPE_CHAR_RNG_UPPER) {
            listed.push_back({pos->value, pos[1].value});
            pos += 2;
        } else if (pos->type == LLAMA_GRETYPE_CHAR_ANY) {
            listed.push_back({0, MAX_CP});
            pos += 1;
        } else {
            listed.push_back({pos->value, pos->value});
            pos += 1;
        }
    } while (pos->type == LLAMA_GRETYPE_CHAR_ALT);
    normalize(listed);
    out.clear();
    if (positive) {
        out = listed;
        return;
    }
    uint32_t next = 0;
    for (const auto & r : listed) {
        if (r.lo > next) {
            out.push_back({next, r.lo - 1});
        }
        next = r.hi + 1;
    }
    if (next <= MAX_CP) {
        out.push_back({next, MAX_CP});
    }
}

// Remove surrogates (no UTF-8 text a model emits holds one).
void drop_surrogates(std::vector<Range> & rs) {
    std::vector<Range> out;
    for (const auto & r : rs) {
        if (r.hi < SUR_LO || r.lo > SUR_HI) {
            out.push_back(r);
            continue;
        }
        if (r.lo < SUR_LO) {
            out.push_back({r.lo, SUR_LO - 1});
        }
        if (r.hi > SUR_HI) {
            out.push_back({SUR_HI + 1, r.hi});
        }
    }
    rs.swap(out);
}

bool contains(const std::vector<Range> & rs, uint32_t c) {
    for (const auto & r : rs) {
        if (r.lo <= c && c <= r.hi) {
            return true;
        }
    }
    return false;
}

// A char set ready to sample from: its ranges (surrogates dropped), split into pieces at 0x80
// and 0x10000 with ASCII pieces weighted 4, so that both ASCII and the rest of Unicode show up.
struct CharSet {
    std::vector<Range>    ranges;
    std::vector<Range>    pieces;
    std::vector<uint32_t> weights;
    uint64_t              total = 0;
};

void prepare(CharSet & cs) {
    drop_surrogates(cs.ranges);
    cs.pieces.clear();
    cs.weights.clear();
    cs.total = 0;
    const uint32_t cuts[] = {0x80, 0x10000};
    for (auto r : cs.ranges) {
        for (uint32_t cut : cuts) {
            if (r.lo < cut && r.hi >= cut) {
                cs.pieces.push_back({r.lo, cut - 1});
                cs.weights.push_back(r.lo < 0x80 ? 4 : 1);
                r.lo = cut;
            }
        }
        cs.pieces.push_back(r);
        cs.weights.push_back(r.lo < 0x80 ? 4 : 1);
    }
    for (auto w : cs.weights) {
        cs.total += w;
    }
}

void append_utf8(std::string & out, uint32_t c) {
    if (c < 0x80) {
        out += static_cast<char>(c);
    } else if (c < 0x800) {
        out += static_cast<char>(0xC0 | (c >> 6));
        out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        out += static_cast<char>(0xE0 | (c >> 12));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (c >> 18));
        out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (c & 0x3F));
    }
}

struct Handle {
    llama_grammar *      grammar = nullptr;
    llama_grammar_stacks initial;  // the stacks right after init: reset between walks and checks
    // per rule element: the fewest code points that complete the alternate from there on
    std::unordered_map<const llama_grammar_element *, uint32_t> rest;
    // per char element met at a stack top: what it matches
    std::unordered_map<const llama_grammar_element *, CharSet> sets;
    // results of the last walk call
    std::string           out;
    std::vector<int64_t>  lengths;   // bytes of each sample in out
    std::vector<uint8_t>  finished;  // 1: the walk ended where the engine allows; 0: hit the hard cap
    uint64_t              stats[6] = {0, 0, 0, 0, 0, 0};
    std::string           failure;   // first probe mismatch, described
};

enum Stat { STEPS = 0, PROBES_OUT = 1, PROBES_OUT_ADMITTED = 2, PROBES_IN = 3, PROBES_IN_REJECTED = 4, DEAD_ENDS = 5 };

constexpr uint32_t FAR = 1u << 30;

uint32_t sat_add(uint32_t a, uint32_t b) {
    return std::min<uint64_t>(static_cast<uint64_t>(a) + b, FAR);
}

// Is pos the first element of an item (a char set, a rule ref, or the end of an alternate)?
bool item_start(const llama_grammar_element * pos) {
    return pos->type != LLAMA_GRETYPE_CHAR_RNG_UPPER && pos->type != LLAMA_GRETYPE_CHAR_ALT;
}

// The shortest completion of every rule (a fixpoint), then of every element position: what a
// walk past its soft budget follows to an end.
void compute_rest(Handle & h) {
    const auto & rules = h.grammar->rules;
    std::vector<uint32_t> minlen(rules.size(), FAR);
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < rules.size(); r++) {
            uint32_t best = FAR;
            uint32_t acc = 0;
            for (size_t i = 0; i < rules[r].size(); i++) {
                const auto & e = rules[r][i];
                if (e.type == LLAMA_GRETYPE_END || e.type == LLAMA_GRETYPE_ALT) {
                    best = std::min(best, acc);
                    acc = 0;
                } else if (e.type == LLAMA_GRETYPE_RULE_REF) {
                    acc = sat_add(acc, e.value < minlen.size() ? minlen[e.value] : FAR);
                } else if (item_start(&e)) {
                    acc = sat_add(acc, 1);
                }
            }
            if (best < minlen[r]) {
                minlen[r] = best;
                changed = true;
            }
        }
    }
    for (const auto & rule : rules) {
        uint32_t acc = 0;  // from the end of the current alternate backwards
        for (size_t k = rule.size(); k-- > 0;) {
            const auto & e = rule[k];
            if (e.type == LLAMA_GRETYPE_END || e.type == LLAMA_GRETYPE_ALT) {
                acc = 0;
            } else if (e.type == LLAMA_GRETYPE_RULE_REF) {
                acc = sat_add(acc, e.value < minlen.size() ? minlen[e.value] : FAR);
            } else if (item_start(&e)) {
                acc = sat_add(acc, 1);
            }
            h.rest[&e] = acc;
        }
    }
}

uint32_t stack_rest(const Handle & h, const llama_grammar_stack & stack) {
    uint32_t total = 0;
    for (const auto * pos : stack) {
        auto it = h.rest.find(pos);
        total = sat_add(total, it == h.rest.end() ? FAR : it->second);
    }
    return total;
}

void reset(Handle & h) {
    h.grammar->stacks = h.initial;
    h.grammar->partial_utf8 = {0, 0};
}

// The engine's state now: the distinct top elements (all char elements after advance) and
// whether some stack is empty.
void read_state(Handle & h, std::vector<const llama_grammar_element *> & tops, bool & can_end) {
    tops.clear();
    can_end = false;
    for (const auto & stack : h.grammar->stacks) {
        if (stack.empty()) {
            can_end = true;
            continue;
        }
        const llama_grammar_element * top = stack.back();
        if (top->type == LLAMA_GRETYPE_TOKEN || top->type == LLAMA_GRETYPE_TOKEN_NOT) {
            continue;  // no vocab: a token element never matches a character
        }
        if (std::find(tops.begin(), tops.end(), top) == tops.end()) {
            tops.push_back(top);
        }
    }
}

// Would the engine accept c now? (the state is restored)
bool engine_takes(Handle & h, uint32_t c) {
    llama_grammar_stacks saved = h.grammar->stacks;
    llama_grammar_accept(h.grammar, c);
    const bool ok = !h.grammar->stacks.empty();
    h.grammar->stacks = std::move(saved);
    return ok;
}

using Rng = std::mt19937_64;

uint32_t uniform(Rng & rng, uint64_t n) {  // [0, n)
    return static_cast<uint32_t>(std::uniform_int_distribution<uint64_t>(0, n - 1)(rng));
}

const CharSet & set_of(Handle & h, const llama_grammar_element * top) {
    auto it = h.sets.find(top);
    if (it == h.sets.end()) {
        CharSet cs;
        element_ranges(top, cs.ranges);
        prepare(cs);
        it = h.sets.emplace(top, std::move(cs)).first;
    }
    return it->second;
}

uint32_t pick_in(Rng & rng, const CharSet & cs) {  // cs.total > 0
    uint64_t k = uniform(rng, cs.total);
    size_t i = 0;
    while (k >= cs.weights[i]) {
        k -= cs.weights[i];
        i++;
    }
    return cs.pieces[i].lo + uniform(rng, static_cast<uint64_t>(cs.pieces[i].hi - cs.pieces[i].lo) + 1);
}

// A code point just outside the allowed union (next to a boundary, or a JSON-structural one).
bool pick_outside(Rng & rng, const std::vector<Range> & allowed, uint32_t & out) {
    std::vector<uint32_t> cands;
    for (const auto & r : allowed) {
        if (r.lo > 0) {
            cands.push_back(r.lo - 1);
        }
        if (r.hi < MAX_CP) {
            cands.push_back(r.hi + 1);
        }
    }
    for (uint32_t c : {0x22u, 0x5Cu, 0x7Bu, 0x7Du, 0x5Bu, 0x5Du, 0x2Cu, 0x3Au, 0x20u, 0x0Au, 0x30u, 0x2Du, 0x61u,
                       0x41u, 0x00u, 0x7Fu, 0xE9u, 0x1F600u}) {
        cands.push_back(c);
    }
    std::vector<uint32_t> keep;
    for (uint32_t c : cands) {
        if (c <= MAX_CP && (c < SUR_LO || c > SUR_HI) && !contains(allowed, c)) {
            keep.push_back(c);
        }
    }
    if (keep.empty()) {
        return false;
    }
    out = keep[uniform(rng, keep.size())];
    return true;
}

std::string describe(const std::vector<uint32_t> & prefix, uint32_t c, const char * what) {
    std::string s = what;
    s += " U+";
    char buf[16];
    std::snprintf(buf, sizeof buf, "%04X", c);
    s += buf;
    s += " after: ";
    for (uint32_t p : prefix) {
        append_utf8(s, p);
    }
    return s;
}

void walk_one(Handle & h, Rng & rng, uint32_t soft_mean, uint32_t hard, uint32_t probe_every) {
    reset(h);
    // this walk's soft budget: uniform in [soft_mean / 8, 2 * soft_mean], short and long answers both
    const uint32_t soft = soft_mean / 8 + uniform(rng, 2 * static_cast<uint64_t>(soft_mean) - soft_mean / 8 + 1);
    std::vector<uint32_t> cps;
    std::vector<const llama_grammar_element *> tops, nearest;
    std::vector<const CharSet *> sets;
    CharSet allowed;  // the union, built when a probe or a fallback needs it
    bool finished = false;
    for (;;) {
        bool can_end = false;
        read_state(h, tops, can_end);
        if (tops.empty()) {
            if (can_end) {
                finished = true;
            } else {
                h.stats[DEAD_ENDS]++;  // no stack at all: the engine rejected what it allowed
                if (h.failure.empty()) {
                    h.failure = describe(cps, 0, "dead end (no stack left)");
                }
            }
            break;
        }
        if (cps.size() >= hard) {
            break;
        }
        const bool late = cps.size() >= soft;
        if (can_end && (late || uniform(rng, tops.size() + 1) == 0)) {
            finished = true;
            break;
        }
        sets.clear();
        for (const auto * top : tops) {
            const CharSet & cs = set_of(h, top);
            if (cs.total > 0) {
                sets.push_back(&cs);
            }
        }
        if (sets.empty()) {
            h.stats[DEAD_ENDS]++;
            if (h.failure.empty()) {
                h.failure = describe(cps, 0, "no character allowed and no end");
            }
            break;
        }
        const CharSet * from = sets[uniform(rng, sets.size())];
        if (late) {  // past the soft budget: follow a stack with the shortest completion
            uint32_t best = FAR + 1;
            nearest.clear();
            for (const auto & stack : h.grammar->stacks) {
                if (stack.empty() || set_of(h, stack.back()).total == 0) {
                    continue;
                }
                const uint32_t d = stack_rest(h, stack);
                if (d < best) {
                    best = d;
                    nearest.clear();
                }
                if (d == best && std::find(nearest.begin(), nearest.end(), stack.back()) == nearest.end()) {
                    nearest.push_back(stack.back());
                }
            }
            if (!nearest.empty()) {
                from = &set_of(h, nearest[uniform(rng, nearest.size())]);
            }
        }
        const uint32_t c = pick_in(rng, *from);
        if (probe_every > 0 && uniform(rng, probe_every) == 0) {
            allowed.ranges.clear();
            for (const auto * cs : sets) {
                allowed.ranges.insert(allowed.ranges.end(), cs->ranges.begin(), cs->ranges.end());
            }
            normalize(allowed.ranges);
            prepare(allowed);
            uint32_t out = 0;
            if (pick_outside(rng, allowed.ranges, out)) {
                h.stats[PROBES_OUT]++;
                if (engine_takes(h, out)) {
                    h.stats[PROBES_OUT_ADMITTED]++;
                    if (h.failure.empty()) {
                        h.failure = describe(cps, out, "engine takes a code point outside the read set:");
                    }
                }
            }
            h.stats[PROBES_IN]++;
            const uint32_t in = pick_in(rng, allowed);
            if (!engine_takes(h, in)) {
                h.stats[PROBES_IN_REJECTED]++;
                if (h.failure.empty()) {
                    h.failure = describe(cps, in, "engine rejects a code point of the read set:");
                }
            }
        }
        llama_grammar_accept(h.grammar, c);
        h.stats[STEPS]++;
        cps.push_back(c);
    }
    const size_t start = h.out.size();
    for (uint32_t p : cps) {
        append_utf8(h.out, p);
    }
    h.lengths.push_back(static_cast<int64_t>(h.out.size() - start));
    h.finished.push_back(finished ? 1 : 0);
}

// Back to the start, then the code points one by one: false as soon as the engine rejects one.
bool feed(Handle & h, const uint32_t * cps, size_t n) {
    reset(h);
    for (size_t i = 0; i < n; i++) {
        llama_grammar_accept(h.grammar, cps[i]);
        if (h.grammar->stacks.empty()) {
            return false;
        }
    }
    return true;
}

// body() at the C boundary: an exception is written to err and `failed` is returned instead.
template <typename T, typename F> T guarded(char * err, size_t errcap, T failed, F && body) {
    try {
        return body();
    } catch (const std::exception & e) {
        set_err(err, errcap, std::string("exception: ") + e.what());
    } catch (...) {
        set_err(err, errcap, "unknown exception");
    }
    return failed;
}

}  // namespace

extern "C" {

int tg_abi_version() {
    return 1;
}

void * tg_new(const char * gbnf, const char * root, char * err, size_t errcap) {
    return guarded<void *>(err, errcap, nullptr, [&]() -> void * {
        g_log.clear();
        llama_log_set(log_cb, nullptr);
        llama_grammar * g = llama_grammar_init_impl(nullptr, gbnf, root, false, nullptr, 0, nullptr, 0);
        if (g == nullptr) {
            set_err(err, errcap, "llama.cpp refused the grammar: " + g_log);
            return nullptr;
        }
        auto * h = new Handle();
        h->grammar = g;
        h->initial = g->stacks;
        compute_rest(*h);
        return h;
    });
}

void tg_free(void * hp) {
    try {
        auto * h = static_cast<Handle *>(hp);
        if (h == nullptr) {
            return;
        }
        llama_grammar_free_impl(h->grammar);
        delete h;
    } catch (...) {
    }
}

// 1: the engine admits the whole string (a stack survives every code point and one is empty at
// the end); 0: it does not; -1: an exception (err).
int tg_accepts(void * hp, const uint32_t * cps, size_t n, char * err, size_t errcap) {
    return guarded(err, errcap, -1, [&]() {
        auto * h = static_cast<Handle *>(hp);
        if (!feed(*h, cps, n)) {
            return 0;
        }
        for (const auto & stack : h->grammar->stacks) {
            if (stack.empty()) {
                return 1;
            }
        }
        return 0;
    });
}

// After feeding cps: the allowed code points as [lo, hi] pairs (up to cap pairs; the count is
// returned, -1 when the prefix is rejected, -2 on an exception) and whether the answer may end.
int64_t tg_allowed(void * hp, const uint32_t * cps, size_t n, uint32_t * pairs, size_t cap, int * can_end, char * err,
                   size_t errcap) {
    return guarded<int64_t>(err, errcap, -2, [&]() -> int64_t {
        auto * h = static_cast<Handle *>(hp);
        if (!feed(*h, cps, n)) {
            return -1;
        }
        std::vector<const llama_grammar_element *> tops;
        bool end = false;
        read_state(*h, tops, end);
        std::vector<Range> allowed, set;
        for (const auto * top : tops) {
            element_ranges(top, set);
            allowed.insert(allowed.end(), set.begin(), set.end());
        }
        normalize(allowed);
        *can_end = end ? 1 : 0;
        for (size_t i = 0; i < allowed.size() && i < cap; i++) {
            pairs[2 * i] = allowed[i].lo;
            pairs[2 * i + 1] = allowed[i].hi;
        }
        return static_cast<int64_t>(allowed.size());
    });
}

// n random walks from seed; results (samples, lengths, finished flags, stats, first probe
// mismatch) stay in the handle until the next call. 0: done; -1: an exception (err).
int tg_walk(void * hp, uint64_t seed, uint32_t n, uint32_t soft, uint32_t hard, uint32_t probe_every, char * err,
            size_t errcap) {
    return guarded(err, errcap, -1, [&]() {
        auto * h = static_cast<Handle *>(hp);
        h->out.clear();
        h->lengths.clear();
        h->finished.clear();
        std::fill(std::begin(h->stats), std::end(h->stats), 0);
        h->failure.clear();
        Rng rng(seed);
        for (uint32_t i = 0; i < n; i++) {
            walk_one(*h, rng, soft, hard, probe_every);
        }
        return 0;
    });
}

const char * tg_out(void * hp, size_t * len) {
    auto * h = static_cast<Handle *>(hp);
    *len = h->out.size();
    return h->out.data();
}

const int64_t * tg_lengths(void * hp) {
    return static_cast<Handle *>(hp)->lengths.data();
}

const uint8_t * tg_finished(void * hp) {
    return static_cast<Handle *>(hp)->finished.data();
}

const uint64_t * tg_stats(void * hp) {
    return static_cast<Handle *>(hp)->stats;
}

const char * tg_failure(void * hp) {
    return static_cast<Handle *>(hp)->failure.c_str();
}

// Time per accepted code point (the bench): feed cps `rounds` times from the initial state and
// return the total nanoseconds spent inside llama_grammar_accept (-1 when rejected, -2 on error).
int64_t tg_time_accept(void * hp, const uint32_t * cps, size_t n, uint32_t rounds, char * err, size_t errcap) {
    return guarded<int64_t>(err, errcap, -2, [&]() -> int64_t {
        auto * h = static_cast<Handle *>(hp);
        int64_t total = 0;
        for (uint32_t r = 0; r < rounds; r++) {
            reset(*h);
            const auto t0 = std::chrono::steady_clock::now();
            for (size_t i = 0; i < n; i++) {
                llama_grammar_accept(h->grammar, cps[i]);
                if (h->grammar->stacks.empty()) {
                    return -1;
                }
            }
            const auto t1 = std::chrono::steady_clock::now();
            total += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
        }
        return total;
    });
}

}  // extern "C"
