#include "pipetrain/observe/stragglers.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "pipetrain/util/stats.hpp"

namespace pipetrain {

const char* name_of(StragglerKind kind) {
  static const char* const names[] = {"rank", "node", "link"};
  return names[static_cast<int>(kind)];
}
namespace {

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f ms", 1e3 * s);
  return buf;
}

std::string times(double ratio) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", ratio);
  return buf;
}

}  // namespace

void WindowFigures::to(double* out) const {
  const double v[kFields] = {steps, own_s, wait_s, link_from[0], link_from[1], link_s[0], link_s[1]};
  std::copy(v, v + kFields, out);
}

WindowFigures WindowFigures::from(const double* in) {
  WindowFigures w;
  w.steps = in[0];
  w.own_s = in[1];
  w.wait_s = in[2];
  w.link_from[0] = in[3];
  w.link_from[1] = in[4];
  w.link_s[0] = in[5];
  w.link_s[1] = in[6];
  return w;
}

void StragglerWindow::add_step(double own_s, double wait_s, const std::map<int, std::vector<double>>& transfer_s) {
  own_s_.push_back(own_s);
  wait_s_.push_back(wait_s);
  for (const auto& [peer, seconds] : transfer_s)
    transfer_s_[peer].insert(transfer_s_[peer].end(), seconds.begin(), seconds.end());
}

bool StragglerWindow::long_enough(double now) const {
  return static_cast<int>(own_s_.size()) >= window_steps_ && now - opened_s_ >= kMinWindowS;
}

WindowFigures StragglerWindow::close(double now) {
  WindowFigures w;
  closing_ = false;
  opened_s_ = now;
  if (own_s_.empty()) return w;
  w.steps = static_cast<double>(own_s_.size());
  w.own_s = median(own_s_);
  w.wait_s = median(wait_s_);
  int k = 0;
  for (const auto& [peer, seconds] : transfer_s_) {  // a rank's incoming links: from the stages before and after it
    if (k == 2) break;
    w.link_from[k] = peer;
    w.link_s[k] = seconds.empty() ? -1 : median(seconds);
    ++k;
  }
  own_s_.clear();
  wait_s_.clear();
  transfer_s_.clear();
  return w;
}

StragglerDetector::StragglerDetector(std::vector<RankPlace> places, std::vector<double> stage_share, double ratio,
                                     bool judge_links)
    : places_(std::move(places)), share_(std::move(stage_share)), ratio_(ratio), judge_links_(judge_links) {
  for (const RankPlace& p : places_)
    if (std::find(nodes_.begin(), nodes_.end(), p.node) == nodes_.end()) nodes_.push_back(p.node);
  // Nodes compare without the cost model only when each holds the same stages.
  std::map<std::string, std::multiset<int>> stages_on;
  for (const RankPlace& p : places_) stages_on[p.node].insert(p.stage);
  for (const auto& [node, stages] : stages_on) nodes_alike_ = nodes_alike_ && stages == stages_on.begin()->second;
}

void StragglerDetector::judge(const std::string& key, const Straggler& now, bool over,
                              std::vector<std::string>& lines) {
  Track& t = tracks_[key];
  t.last = now;
  t.over = over ? t.over + 1 : 0;
  t.under = over ? 0 : t.under + 1;
  const std::string steps = " (steps " + std::to_string(now.first_step) + "-" + std::to_string(now.last_step) + ")";
  if (!t.flagged && t.over >= 2) {
    t.flagged = true;
    std::string what;
    if (now.kind == StragglerKind::link)
      what = "delivers a message in " + ms(now.seconds) + ", " + times(now.ratio) + " the other links of its kind (" +
             ms(now.peers_seconds) + ")";
    else
      what = "computes " + times(now.ratio) + " as long as " +
             (now.kind == StragglerKind::node ? "the other nodes" : "its peers") + ": " + ms(now.seconds) +
             " per step against " + ms(now.peers_seconds);
    lines.push_back("straggler: " + now.name + " " + what + steps);
  } else if (t.flagged && t.under >= 2) {
    t.flagged = false;
    lines.push_back("straggler cleared: " + now.name + " is back within " + times(ratio_) + " of its peers (" +
                    times(now.ratio) + ")" + steps);
  }
}

double StragglerDetector::share(size_t rank) const {
  const double s = share_[places_[rank].stage];
  return s > 0 ? s : 1 / static_cast<double>(share_.size());
}

Straggler StragglerDetector::in_window(Straggler s) const {
  s.first_step = first_step_;
  s.last_step = last_step_;
  return s;
}

std::vector<std::string> StragglerDetector::observe(const std::vector<WindowFigures>& ranks, int last_step) {
  std::vector<std::string> lines;
  if (ranks.empty() || ranks[0].steps <= 0 || ranks.size() != places_.size()) return lines;
  last_ = ranks;
  last_step_ = last_step;
  first_step_ = last_step - static_cast<int>(ranks[0].steps) + 1;
  std::vector<double>& per_work = per_work_;
  per_work.assign(ranks.size(), 0.0);
  for (size_t r = 0; r < ranks.size(); ++r) per_work[r] = ranks[r].own_s / share(r);
  std::vector<bool> slow = observe_ranks(ranks, per_work, lines);
  observe_nodes(ranks, per_work, slow, lines);
  observe_links(ranks, slow, lines);
  return lines;
}

std::vector<bool> StragglerDetector::observe_ranks(const std::vector<WindowFigures>& ranks,
                                                   const std::vector<double>& per_work,
                                                   std::vector<std::string>& lines) {
  const size_t R = ranks.size();
  rank_ratio_.assign(R, 1.0);
  expected_s_.assign(R, 0.0);
  rank_threshold_.assign(R, ratio_);
  for (size_t r = 0; r < R; ++r) {
    std::vector<double> peers;  // its replicas (or, with none, everyone: through the cost model)
    for (size_t q = 0; q < R; ++q)
      if (q != r && places_[q].stage == places_[r].stage) peers.push_back(per_work[q]);
    const double peer = peers.empty() ? median_without(per_work, r) : median(peers);
    if (!(peer > 0)) continue;  // a single rank has no peers
    rank_ratio_[r] = per_work[r] / peer;
    expected_s_[r] = peer * share(r);
    if (peers.empty()) rank_threshold_[r] = ratio_ * kModelError;
    const RankPlace& p = places_[r];
    const std::string name = "rank " + std::to_string(r) + " (stage " + std::to_string(p.stage) + ", replica " +
                             std::to_string(p.replica) + ", " + p.node + ")";
    judge(name, in_window({StragglerKind::rank, name, rank_ratio_[r], ranks[r].own_s, peer * share(r)}),
          rank_ratio_[r] > rank_threshold_[r], lines);
  }
  // Ranks slow in this window, themselves or (observe_nodes) as part of a slow node: their links
  // are late because of them.
  std::vector<bool> slow(R, false);
  for (size_t r = 0; r < R; ++r) slow[r] = rank_ratio_[r] > rank_threshold_[r];
  return slow;
}

void StragglerDetector::observe_nodes(const std::vector<WindowFigures>& ranks, const std::vector<double>& per_work,
                                      std::vector<bool>& slow, std::vector<std::string>& lines) {
  const size_t R = ranks.size();
  node_ratio_.assign(nodes_.size(), 1.0);
  if (nodes_.size() < 2) return;
  std::vector<double> node_value(nodes_.size()), node_compute(nodes_.size()), node_share(nodes_.size());
  for (size_t n = 0; n < nodes_.size(); ++n) {
    std::vector<double> v, c, s;
    for (size_t r = 0; r < R; ++r)
      if (places_[r].node == nodes_[n]) {
        v.push_back(per_work[r]);
        c.push_back(ranks[r].own_s);
        s.push_back(share(r));
      }
    node_value[n] = median(v);
    node_compute[n] = median(c);
    node_share[n] = median(s);
  }
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const double peer = median_without(node_value, n);
    const double ratio = node_ratio_[n] = peer > 0 ? node_value[n] / peer : 1.0;
    const std::string name = "node " + nodes_[n];
    const bool over = ratio > ratio_ * (nodes_alike_ ? 1.0 : kModelError);
    judge(name, in_window({StragglerKind::node, name, ratio, node_compute[n], peer * node_share[n]}), over, lines);
    for (size_t r = 0; r < R && over; ++r) slow[r] = slow[r] || places_[r].node == nodes_[n];
  }
}

void StragglerDetector::observe_links(const std::vector<WindowFigures>& ranks, const std::vector<bool>& slow,
                                      std::vector<std::string>& lines) {
  const size_t R = ranks.size();
  std::map<std::pair<int, int>, size_t> rank_at;  // (stage, replica) -> world rank
  for (size_t r = 0; r < R; ++r) rank_at[{places_[r].stage, places_[r].replica}] = r;
  links_.clear();
  for (size_t to = 0; to < R; ++to)
    for (int k = 0; k < 2; ++k)
      if (ranks[to].link_from[k] >= 0 && ranks[to].link_s[k] >= 0)
        links_.push_back({static_cast<int>(rank_at.at({static_cast<int>(ranks[to].link_from[k]), places_[to].replica})),
                          static_cast<int>(to), ranks[to].link_s[k]});
  auto crosses = [&](const Link& l) { return places_[l.from].node != places_[l.to].node; };
  std::set<std::string> measured;
  for (const Link& l : links_) {
    if (!judge_links_) break;  // measured and logged, not judged
    std::vector<double> peers;
    for (const Link& o : links_)
      if (&o != &l && crosses(o) == crosses(l)) peers.push_back(o.seconds);
    const double peer = median(peers);
    if (!(peer > 0)) continue;  // no other link of its kind
    const std::string name = "link rank " + std::to_string(l.from) + " -> rank " + std::to_string(l.to) + " (" +
                             places_[l.from].node + (crosses(l) ? " -> " + places_[l.to].node : "") + ")";
    measured.insert(name);
    const double ratio = l.seconds / peer;
    // A slow sender passes its messages on late and a slow receiver takes them in late: not the link's doing.
    const bool ends_slow = slow[l.from] || slow[l.to];
    judge(name, in_window({StragglerKind::link, name, ratio, l.seconds, peer}),
          ratio > ratio_ && l.seconds - peer > kLinkFloorS && !ends_slow, lines);
  }
  // A flagged link nobody waited on this window costs nothing now: it counts as within the ratio.
  for (auto& [key, t] : tracks_)
    if (t.last.kind == StragglerKind::link && !measured.count(key)) {
      Straggler quiet = in_window(t.last);
      quiet.ratio = 1.0;
      judge(key, quiet, false, lines);
    }
}

std::vector<std::string> StragglerDetector::nodes_over(int windows) const {
  std::vector<std::pair<double, std::string>> over;
  for (const std::string& node : nodes_) {
    const auto t = tracks_.find("node " + node);
    if (t != tracks_.end() && t->second.over >= windows) over.emplace_back(-t->second.last.ratio, node);
  }
  std::sort(over.begin(), over.end());  // slowest first
  std::vector<std::string> out;
  for (const auto& [ratio, node] : over) out.push_back(node);
  return out;
}

bool StragglerDetector::rank_over(int windows) const {
  for (const auto& [key, t] : tracks_)
    if (t.last.kind == StragglerKind::rank && t.over >= windows) return true;
  return false;
}

std::vector<Straggler> StragglerDetector::flagged() const {
  std::vector<Straggler> out;
  for (const auto& [key, t] : tracks_)
    if (t.flagged) out.push_back(t.last);
  return out;
}

nlohmann::json StragglerDetector::window_json() const {
  using json = nlohmann::json;
  json w = {{"first_step", first_step_}, {"last_step", last_step_}, {"nodes", nodes_}};
  json node = json::array(), stage = json::array(), replica = json::array(), compute = json::array(),
       wait = json::array(), links = json::array();
  for (size_t r = 0; r < places_.size() && r < last_.size(); ++r) {
    node.push_back(std::find(nodes_.begin(), nodes_.end(), places_[r].node) - nodes_.begin());
    stage.push_back(places_[r].stage);
    replica.push_back(places_[r].replica);
    compute.push_back(last_[r].own_s);
    wait.push_back(last_[r].wait_s);
  }
  for (const Link& l : links_) links.push_back({{"from", l.from}, {"to", l.to}, {"s", l.seconds}});
  w["rank_node"] = node;
  w["rank_stage"] = stage;
  w["rank_replica"] = replica;
  w["own_s"] = compute;
  w["wait_s"] = wait;
  w["expected_s"] = expected_s_;
  w["ratio"] = rank_ratio_;
  w["threshold"] = rank_threshold_;
  w["node_ratio"] = node_ratio_;
  w["links"] = links;
  json flagged_now = json::array();
  for (const Straggler& s : flagged())
    flagged_now.push_back({{"kind", name_of(s.kind)},
                           {"name", s.name},
                           {"ratio", s.ratio},
                           {"seconds", s.seconds},
                           {"peers_seconds", s.peers_seconds}});
  return {{"window", w}, {"stragglers", flagged_now}};
}

}  // namespace pipetrain
