// Straggler detection: which rank, node or link is persistently slower than its peers.
//
// Every rank keeps its own time (the step less its waits) and waits per step, and how long each
// message it had to wait for took to come (StragglerWindow). A window lasts log.straggler_window
// steps and at least kMinWindowS seconds (rank 0's clock says so in the step agreement every step
// makes anyway), so that a hiccup of the host is never a whole window however short the steps. At the first logging
// step after, each rank's medians over the window travel to rank 0 in the metrics gather the logging step makes anyway:
// no collective of its own. There StragglerDetector compares
//   - each rank's own time with its peers': the replicas of its stage (the same work), or without
//     replicas all other ranks, each divided by its stage's expected share of the work (plan's
//     cost model), so a stage that holds the LM head is not taken for slow;
//   - each node (2+ nodes) by the median of its ranks, against the other nodes;
//   a comparison that goes through the cost model (other stages' work) allows for its error:
//   there the threshold is log.straggler_ratio x kModelError;
//   - each link's travel time with the other links of its kind (within a node, across nodes),
//     unless either end is slow itself (its messages are late because of it); not where ranks
//     outnumber cores: there a message's travel mostly says when its sender got a core.
// One over log.straggler_ratio in two windows in a row is reported, and again only when it has been
// within the ratio for two windows in a row: a single noisy window never raises or clears one.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace pipetrain {

// One rank's figures for a closed window, gathered to rank 0 as doubles.
struct WindowFigures {
  double steps = 0;              // steps in the window; 0: no window closed at this logging step
  double own_s = 0, wait_s = 0;  // medians per step: its own time (step less waits, or its passes' CPU time), its waits
  double link_from[2] = {-1, -1};  // the sending stage of up to two incoming links (-1: none)
  double link_s[2] = {-1, -1};     // median travel time of their messages waited for (-1: none waited for)
  static constexpr size_t kFields = 7;
  void to(double* out) const;
  static WindowFigures from(const double* in);
};

// One rank's measurements since the last closed window.
class StragglerWindow {
 public:
  static constexpr double kMinWindowS = 1.0;
  // A window opened at `now` (now_s()) of at least `window_steps` steps.
  StragglerWindow(int window_steps, double now) : window_steps_(window_steps), opened_s_(now) {}
  // One training step: its compute and waits, and the travel times of the messages this rank
  // waited for, by sending stage.
  void add_step(double own_s, double wait_s, const std::map<int, std::vector<double>>& transfer_s);
  // Whether the window holds its steps and has lasted kMinWindowS at `now` (rank 0 asks; its
  // answer, agreed by all ranks, is agree_to_close()).
  bool long_enough(double now) const;
  void agree_to_close() { closing_ = true; }
  bool closing() const { return closing_; }
  // At the next logging step after agree_to_close(): the window's figures; a fresh window opens at `now`.
  WindowFigures close(double now);

 private:
  int window_steps_;
  double opened_s_;
  bool closing_ = false;
  std::vector<double> own_s_, wait_s_;
  std::map<int, std::vector<double>> transfer_s_;
};

// Where a rank sits.
struct RankPlace {
  int stage = 0, replica = 0;
  std::string node;
};

// What a straggler is; its spelling (name_of) goes into metrics.jsonl's "stragglers".
enum class StragglerKind { rank, node, link };
const char* name_of(StragglerKind kind);

// A rank, node or link over the ratio.
struct Straggler {
  StragglerKind kind;
  std::string name;  // "rank 3 (stage 0, replica 1, node2)", "node node2", "link rank 1 -> rank 0 (node2 -> node1)"
  double ratio = 0;  // its figure over its peers' median
  double seconds = 0,
         peers_seconds = 0;           // the figures: compute per step (normalised for ranks and nodes) or travel time
  int first_step = 0, last_step = 0;  // the window that showed it
};

class StragglerDetector {
 public:
  // `places` per world rank; `stage_share` each stage's expected share of the pipeline's compute
  // (summing to 1); `ratio` log.straggler_ratio; `judge_links` false where ranks outnumber cores.
  StragglerDetector(std::vector<RankPlace> places, std::vector<double> stage_share, double ratio,
                    bool judge_links = true);

  // One closed window ending at `last_step` (1-based), all ranks' figures in world order. Returns
  // the lines to print: stragglers found, and those that are no longer.
  std::vector<std::string> observe(const std::vector<WindowFigures>& ranks, int last_step);

  // Those flagged now (after observe), and per rank its compute ratio to its peers in the last window.
  std::vector<Straggler> flagged() const;
  const std::vector<double>& rank_ratio() const { return rank_ratio_; }

  // What log.straggler_action acts on, after observe: the nodes (slowest first), and whether any
  // rank, over the ratio in the last `windows` windows in a row; per rank its own time in the last window per unit
  // of its stage's expected share (its speed, as the partition would see it: seconds per share).
  std::vector<std::string> nodes_over(int windows) const;
  bool rank_over(int windows) const;
  const std::vector<double>& per_work_s() const { return per_work_; }
  const std::vector<RankPlace>& places() const { return places_; }

  // The metrics.jsonl keys of the last window: "window" (per rank: stage, replica, node, compute,
  // wait, the compute its peers suggest, the ratio to it and the ratio it is flagged above; per
  // node its ratio; the links' travel times) and "stragglers" (flagged now): the two keys a logging
  // step's metrics.jsonl line takes over.
  nlohmann::json window_json() const;

  // Below this a link's extra travel time is within what polling between kernels adds to any message.
  static constexpr double kLinkFloorS = 1e-3;
  // How far plan's FLOP shares of two stages were from their measured compute on the 2-core test
  // machine (a 2 x 1 tiny run measures stage 1 at 1.01-1.45x stage 0 where plan says 1.17x, by
  // where the ranks run): comparisons across stages flag at the ratio times this.
  static constexpr double kModelError = 1.25;

 private:
  struct Track {
    Straggler last;           // the latest window's figures
    int over = 0, under = 0;  // windows in a row over / within the ratio
    bool flagged = false;
  };
  void judge(const std::string& key, const Straggler& now, bool over, std::vector<std::string>& lines);
  // The three comparisons of one window. Ranks: compute per unit of expected work (per_work)
  // against their replicas'; returns which ranks are slow. Nodes: their ranks' median against the
  // other nodes', marking the ranks of a slow node slow too. Links: travel time against the other
  // links of their kind, not blamed for slow ends.
  std::vector<bool> observe_ranks(const std::vector<WindowFigures>& ranks, const std::vector<double>& per_work,
                                  std::vector<std::string>& lines);
  void observe_nodes(const std::vector<WindowFigures>& ranks, const std::vector<double>& per_work,
                     std::vector<bool>& slow, std::vector<std::string>& lines);
  void observe_links(const std::vector<WindowFigures>& ranks, const std::vector<bool>& slow,
                     std::vector<std::string>& lines);
  double share(size_t rank) const;         // its stage's expected share of the pipeline's compute
  Straggler in_window(Straggler s) const;  // s, dated with this window's steps

  std::vector<RankPlace> places_;
  std::vector<std::string> nodes_;  // each node once, in rank order
  std::vector<double> share_;
  double ratio_;
  bool judge_links_;
  std::map<std::string, Track> tracks_;
  std::vector<WindowFigures> last_;
  std::vector<double> rank_ratio_, expected_s_;  // per rank: compute over its peers', the compute its peers suggest
  std::vector<double> per_work_;                 // per rank: compute per unit of its stage's share
  std::vector<double> rank_threshold_;           // per rank: the ratio it is flagged above
  bool nodes_alike_ = true;                      // every node holds the same stages
  std::vector<double> node_ratio_;
  int first_step_ = 0, last_step_ = 0;
  struct Link {
    int from, to;
    double seconds;
  };
  std::vector<Link> links_;
};

}  // namespace pipetrain
