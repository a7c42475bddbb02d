#include "pipetrain/planner/costs.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "pipetrain/model/block_tensors.hpp"
#include "pipetrain/model/layer_decl.hpp"

namespace pipetrain {
namespace {

// Linear between the two neighbouring points of a curve sorted by x, proportional beyond its ends
// (work grows with the size there, as the matrix products do).
template <class Point, class X, class Y>
double interpolate(const std::vector<Point>& pts, double x, X x_of, Y y_of) {
  if (pts.empty()) return 0;
  if (x <= x_of(pts.front())) return y_of(pts.front()) * x / x_of(pts.front());
  for (size_t i = 1; i < pts.size(); ++i)
    if (x <= x_of(pts[i])) {
      const double x0 = x_of(pts[i - 1]), x1 = x_of(pts[i]), t = (x - x0) / (x1 - x0);
      return y_of(pts[i - 1]) + t * (y_of(pts[i]) - y_of(pts[i - 1]));
    }
  return y_of(pts.back()) * x / x_of(pts.back());
}

template <class Which>
PassCosts pass_at(const std::vector<MachineCosts::AtSize>& pts, int samples, Which which) {
  auto x = [](const MachineCosts::AtSize& p) { return static_cast<double>(p.samples); };
  PassCosts r;
  for (double PassCosts::*part : {&PassCosts::f, &PassCosts::b, &PassCosts::w})
    r.*part = interpolate(pts, samples, x, [&](const MachineCosts::AtSize& p) { return which(p).*part; });
  return r;
}

double transfer_at(const std::vector<MachineCosts::Transfer>& pts, double bytes) {
  if (pts.empty() || bytes <= 0) return 0;
  if (bytes <= pts.front().bytes) return pts.front().seconds;  // latency-bound below the smallest size
  return interpolate(
      pts, bytes, [](auto& p) { return p.bytes; }, [](auto& p) { return p.seconds; });
}

nlohmann::json pass_json(const PassCosts& p) { return {{"f", p.f}, {"b", p.b}, {"w", p.w}}; }
PassCosts pass_from(const nlohmann::json& j) {
  return {j.at("f").get<double>(), j.at("b").get<double>(), j.at("w").get<double>()};
}

}  // namespace

PassCosts stage_passes(const PassCosts& block, const PassCosts& embed, const PassCosts& head, int blocks, bool first,
                       bool last) {
  PassCosts c{blocks * block.f, blocks * block.b, blocks * block.w};
  auto add = [&c](const PassCosts& x) {
    c.f += x.f;
    c.b += x.b;
    c.w += x.w;
  };
  if (first) add(embed);
  if (last) add(head);
  return c;
}

PassCosts MachineCosts::block(int samples) const {
  return pass_at(compute, samples, [](const AtSize& a) { return a.block; });
}
PassCosts MachineCosts::embed(int samples) const {
  return pass_at(compute, samples, [](const AtSize& a) { return a.embed; });
}
PassCosts MachineCosts::head(int samples) const {
  return pass_at(compute, samples, [](const AtSize& a) { return a.head; });
}

PassCosts MachineCosts::block_under(Recompute mode, int samples) const {
  const PassCosts plain = block(samples);
  if (mode == Recompute::none) return plain;
  const int i = mode == Recompute::block ? 0 : 1;
  const PassCosts measured = pass_at(compute, samples, [&](const AtSize& a) { return a.block_recompute[i]; });
  if (measured.f > 0) return measured;
  return {plain.f, plain.f + plain.backward(), 0};  // not measured: the forward again, then the backward
}
double MachineCosts::p2p_s(double bytes) const { return transfer_at(p2p, bytes); }

double MachineCosts::allreduce_s(double bytes, int ranks) const {
  if (ranks <= 1) return 0;
  const double measured = transfer_at(allreduce, bytes), D0 = allreduce_ranks, D = ranks;
  return measured * (2 * (D - 1) / D) / (2 * (D0 - 1) / D0);
}

double MachineCosts::gather_refill_s(double bytes) const { return transfer_at(gather_refill, bytes); }

double MachineCosts::node_allreduce_s(double bytes, int ranks) const {
  if (ranks <= 1 || node_allreduce.empty()) return allreduce_s(bytes, ranks);
  const double D = ranks;
  return transfer_at(node_allreduce, bytes) * (2 * (D - 1) / D);  // measured as at D = 2
}

// The block a cost was measured on beyond d_model and n_head: "gpt2", or llama's key/value heads
// and SwiGLU width (the products that differ).
std::string block_family(const RunSpec& spec) {
  if (spec.model.arch == Arch::gpt2) return "gpt2";
  const BlockShape s = block_shape(spec);
  std::string family = "llama, " + std::to_string(s.NKV) + " key/value heads, SwiGLU " + std::to_string(s.ffn);
  const auto& moe = spec.model.moe;
  if (moe.on())
    family += ", MoE every " + std::to_string(moe.every) + ": " + std::to_string(moe.experts) + " experts, top " +
              std::to_string(moe.top_k) + ", SwiGLU " + std::to_string(moe.ffn_hidden) + ", shared " +
              std::to_string(moe.shared_experts);
  return family;
}

nlohmann::json MachineCosts::to_json() const {
  nlohmann::json j;
  j["source"] = source;
  j["model"] = {{"d_model", d_model}, {"n_head", n_head}, {"seq_len", seq_len}, {"vocab", vocab}, {"family", family}};
  for (const AtSize& a : compute)
    j["compute"].push_back({{"samples", a.samples},
                            {"block", pass_json(a.block)},
                            {"embed", pass_json(a.embed)},
                            {"head", pass_json(a.head)},
                            {"block_recompute_block", pass_json(a.block_recompute[0])},
                            {"block_recompute_stage", pass_json(a.block_recompute[1])}});
  j["adamw_s_per_param"] = adamw_s_per_param;
  j["p2p"] = nlohmann::json::array();
  for (const Transfer& t : p2p) j["p2p"].push_back({{"bytes", t.bytes}, {"seconds", t.seconds}});
  j["allreduce"] = nlohmann::json::array();
  for (const Transfer& t : allreduce) j["allreduce"].push_back({{"bytes", t.bytes}, {"seconds", t.seconds}});
  j["allreduce_ranks"] = allreduce_ranks;
  if (!node_allreduce.empty()) {
    j["node_allreduce"] = nlohmann::json::array();
    for (const Transfer& t : node_allreduce)
      j["node_allreduce"].push_back({{"bytes", t.bytes}, {"seconds", t.seconds}});
  }
  if (!gather_refill.empty()) {
    j["gather_refill"] = nlohmann::json::array();
    for (const Transfer& t : gather_refill) j["gather_refill"].push_back({{"bytes", t.bytes}, {"seconds", t.seconds}});
  }
  return j;
}

MachineCosts MachineCosts::from_json(const nlohmann::json& j, const std::string& where) {
  MachineCosts c;
  try {
    c.source = j.value("source", std::string("a cost file"));
    const auto& m = j.at("model");
    c.d_model = m.at("d_model");
    c.n_head = m.at("n_head");
    c.seq_len = m.at("seq_len");
    c.vocab = m.at("vocab");
    c.family = m.value("family", std::string("gpt2"));  // files from before the llama family
    for (const auto& a : j.at("compute")) {
      AtSize at{
          a.at("samples").get<int>(), pass_from(a.at("block")), pass_from(a.at("embed")), pass_from(a.at("head")), {}};
      if (a.contains("block_recompute_block")) at.block_recompute[0] = pass_from(a.at("block_recompute_block"));
      if (a.contains("block_recompute_stage")) at.block_recompute[1] = pass_from(a.at("block_recompute_stage"));
      c.compute.push_back(at);
    }
    c.adamw_s_per_param = j.at("adamw_s_per_param");
    for (const auto& t : j.at("p2p")) c.p2p.push_back({t.at("bytes"), t.at("seconds")});
    for (const auto& t : j.at("allreduce")) c.allreduce.push_back({t.at("bytes"), t.at("seconds")});
    c.allreduce_ranks = j.at("allreduce_ranks");
    if (j.contains("node_allreduce"))
      for (const auto& t : j.at("node_allreduce")) c.node_allreduce.push_back({t.at("bytes"), t.at("seconds")});
    if (j.contains("gather_refill"))  // files from before it, and GPUs': none
      for (const auto& t : j.at("gather_refill")) c.gather_refill.push_back({t.at("bytes"), t.at("seconds")});
  } catch (const nlohmann::json::exception& e) {
    throw SpecError(where + ": not a cost file (" + e.what() + "); write one with pipetrain plan --calibrate");
  }
  if (c.compute.empty()) throw SpecError(where + ": cost file has no compute measurements");
  auto by_samples = [](const AtSize& a, const AtSize& b) { return a.samples < b.samples; };
  auto by_bytes = [](const Transfer& a, const Transfer& b) { return a.bytes < b.bytes; };
  std::sort(c.compute.begin(), c.compute.end(), by_samples);
  std::sort(c.p2p.begin(), c.p2p.end(), by_bytes);
  std::sort(c.allreduce.begin(), c.allreduce.end(), by_bytes);
  std::sort(c.gather_refill.begin(), c.gather_refill.end(), by_bytes);
  for (const AtSize& a : c.compute)
    if (a.samples < 1 || a.block.f <= 0 || a.block.b <= 0 || a.block.w < 0)
      throw SpecError(where + ": compute entry for " + std::to_string(a.samples) + " samples has non-positive times");
  if (c.allreduce_ranks < 2) throw SpecError(where + ": allreduce_ranks must be at least 2");
  return c;
}

MachineCosts MachineCosts::read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SpecError("--costs " + path + ": cannot read it (write one with pipetrain plan --calibrate)");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw SpecError("--costs " + path + ": not JSON (" + e.what() + ")");
  }
  return from_json(j, "--costs " + path);
}

bool MachineCosts::is_cost_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  try {
    read(path);
    return true;
  } catch (const SpecError&) {
    return false;
  }
}

MachineCosts MachineCosts::for_model(const RunSpec& spec) {
  MachineCosts c;
  c.d_model = spec.model.d_model;
  c.n_head = spec.model.n_head;
  c.seq_len = spec.model.seq_len;
  c.vocab = spec.model.vocab;
  c.family = block_family(spec);
  return c;
}

MachineCosts MachineCosts::from_peak(const RunSpec& spec, double flops_per_s, double efficiency,
                                     double link_bytes_per_s, double node_link_bytes_per_s) {
  MachineCosts c = for_model(spec);
  const double rate = flops_per_s * efficiency;
  char what[200];
  std::snprintf(what, sizeof what, "a peak of %.3g TFLOP/s per rank at %.0f%% of it, %.3g GB/s links",
                flops_per_s / 1e12, 100 * efficiency, link_bytes_per_s / 1e9);
  c.source = what;
  if (node_link_bytes_per_s > 0) {
    std::snprintf(what, sizeof what, " (%.3g GB/s within a node)", node_link_bytes_per_s / 1e9);
    c.source += what;
  }
  AtSize one = flops_per_sample(spec);
  for (PassCosts* p : {&one.block, &one.embed, &one.head}) {
    p->f /= rate;
    p->b /= rate;
    p->w /= rate;
  }
  c.compute = {one};
  // AdamW is memory-bound: 28 bytes per parameter read and written, at a memory bandwidth of the
  // peak / 200 FLOP per byte (the balance of today's datacentre GPUs).
  c.adamw_s_per_param = 28.0 / (flops_per_s / 200);
  const double latency = 10e-6;
  c.p2p = {{1, latency}, {1e9, latency + 1e9 / link_bytes_per_s}};
  c.allreduce_ranks = 2;
  c.allreduce = {{1, 2 * latency}, {1e9, 2 * latency + 1e9 / link_bytes_per_s}};  // 2(D-1)/D = 1 at D = 2
  if (node_link_bytes_per_s > 0)
    c.node_allreduce = {{1, 2 * latency}, {1e9, 2 * latency + 1e9 / node_link_bytes_per_s}};
  return c;
}

MachineCosts::AtSize MachineCosts::flops_per_sample(const RunSpec& spec) {
  // One sample's tokens through each layer's passes, as layer_decl.hpp declares their FLOPs.
  const int T = spec.model.seq_len;
  auto passes = [&](Layer layer) {
    const LayerWidths whole = whole_widths(spec, layer);
    auto at = [&](Pass p) { return T * layer_flops(layer, p, whole, T).total(); };
    return PassCosts{at(Pass::forward), at(Pass::input), at(Pass::weight)};
  };
  AtSize one;
  one.samples = 1;
  // A block: the mean of the model's (its MoE blocks' FLOPs are their active experts').
  const BlockKinds kinds = block_kinds(spec, {0, spec.model.n_layer});
  const PassCosts dense = passes(Layer::block), moe = passes(Layer::moe_block);
  auto mean = [&](double d, double m) { return (kinds.dense * d + kinds.moe * m) / spec.model.n_layer; };
  one.block = {mean(dense.f, moe.f), mean(dense.b, moe.b), mean(dense.w, moe.w)};
  one.head = passes(Layer::head);
  one.embed = passes(Layer::embedding);
  return one;
}

void MachineCosts::check_fits(const RunSpec& spec, const std::string& where) const {
  const auto& m = spec.model;
  if (d_model != m.d_model || n_head != m.n_head || seq_len != m.seq_len || vocab != m.vocab ||
      family != block_family(spec))
    throw SpecError(where + ": measured on d_model " + std::to_string(d_model) + ", n_head " + std::to_string(n_head) +
                    ", seq_len " + std::to_string(seq_len) + ", vocab " + std::to_string(vocab) + " (" + family +
                    "); the spec has " + std::to_string(m.d_model) + ", " + std::to_string(m.n_head) + ", " +
                    std::to_string(m.seq_len) + ", " + std::to_string(m.vocab) + " (" + block_family(spec) +
                    ") (calibrate with this spec: pipetrain plan --calibrate --config ...)");
}

}  // namespace pipetrain
