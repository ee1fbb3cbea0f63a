"""Confidence intervals over tasks that hold with the 2 to 10 tasks real baseline studies have.

The unit of replication is the task: a group's score at a checkpoint is the mean over tasks of
each task's mean attempt score, and tasks are what a study samples from the population of
possible tasks. So the interval is built from one number per task (its mean attempt score, its
best-of-k estimate, or the paired difference between two groups on it), with ``n - 1`` degrees
of freedom. Attempts within a task need no separate term: their noise is already inside each
task's number.

Why not the hierarchical bootstrap's percentile interval: with 2 or 3 tasks a resampled mean
takes only 3 or 10 distinct values, the expanded tail that corrects its narrowness falls below
one replicate, and the "95%" interval becomes the min-max of the replicates (coverage 0.75 at 2
tasks, 0.86 at 3, moving with the number of replicates). A t-interval needs no replicates, so its
bounds carry no Monte Carlo error at all.

Scores are right-skewed (a few tasks do much better than the rest), and a skewed sample's mean
and standard deviation rise together, so a plain t-interval misses high values of the mean more
often than it should (0.92-0.93 measured at 3-10 tasks on RE-Bench-shaped data, 0.86-0.88 with
heavy skew). Which interval serves depends on whether the scores have a known range:

- No known range (normalised scores of scored tasks, best-of-k estimates), every task value
  above 0: the profile-likelihood interval for the mean of log-normal values. With y the logs of
  the n task values, mean ybar and maximum-likelihood variance s^2 (divisor n), theta = mu +
  sigma^2 / 2 the log of the mean, the interval holds the thetas whose likelihood ratio
  statistic W(theta) = 2 (l(max) - l_p(theta)) is at most n log(1 + t_{n-1}^2 / (n - 1)): on a
  normal mean the ratio statistic is n log(1 + T^2 / (n - 1)), so this calibration makes the rule
  exactly the t-interval there (the chi-square calibration, 3.84, covered 0.85 at 3 tasks). The
  profile is closed-form (for a given theta the likelihood peaks at sigma^2 = 2 (sqrt(1 + s^2 +
  (ybar - theta)^2) - 1)), the bounds found by bisection. Normalised scores are ratios to a
  reference, and tasks differ from one another by factors (one task twice as hard as another),
  which is what a log scale makes symmetric. The reported estimate stays the plain mean over
  tasks, and the bounds are held to contain it. Over few tasks the upper bound runs off (median
  width 5,700 at 3 tasks of log sd 1.2, e^50 and beyond when one task is near 0); it is held to
  MAX_LOG_STRETCH = 4 plain t half-widths from the mean, which costs 0.011 coverage at 3 tasks of
  log sd 1.2 (0.953 uncapped, 4,000 studies), 0.007 at 5, none measurable at sd 0.8.
  It replaced the modified Cox interval (Land 1972; Zhou & Gao 1997, Stat. Med.),

      exp(ybar + s^2 / 2  +/-  t_{n-1} sqrt(s^2 / n + s^4 / (2 (n - 1)))),  s^2 with divisor n - 1,

  which estimates sigma^2 / 2 from a sample that, over 3-5 tasks, often understates it: at log
  sd 1.2 it covered 0.921 / 0.923 at 3 / 5 tasks, at 0.8 on the model below 0.937 / 0.940 / 0.945.
  The Cox interval still serves bounded values near an end (below) and the groups' intervals
  MOVER combines (paired differences, below).
- No known range, some task value at 0 or below (a task where nobody beat the starting solution
  yet): the t-interval with Hall's (1992) skewness correction,
  f(T) = T + a T^2 / 3 + a^2 T^3 / 27 + a / 6, a = skewness / sqrt(n), inverted at the
  Student-t quantiles, capped to stretch a side at most MAX_STRETCH = 2 times (where f flattens
  its inverse runs away: one low task among four similar ones put the lower bound 9 standard
  errors away).
- A known range (rubric and EXP-Bench scores in [0, 1]), some task exactly at an end of it (a
  task at 0, the shape benchmarks produce most), under WILSON_MIN_TASKS = 20 tasks: the plain t.
  Values piled on an end are two-point-like, and a skewness correction over-corrects them
  (0.985-0.990 coverage at 5-20 zero-inflated tasks against 0.948-0.991 for the plain t).
- The same from 20 tasks on: the Wilson score interval for the mean's position in the range on
  the effective number of tasks n / deff, with Kish's design effect deff = s^2 / (p (1 - p)),
  the sample variance over the largest one a mean p allows (Korn & Graubard 1998 use it so for
  survey proportions; on 0/1 values it is Wilson's interval with n - 1 tasks). Like Wilson's it
  reaches further from the nearer end than towards it: where most tasks sit at 0 the plain t
  misses high values of the mean, 0.90 on zero-heavy ties at 20 and 40 tasks, this 0.963 /
  0.946. Under 20 tasks it over-covered zero-inflated values at 10 (0.986 against the t's
  0.948, 4,000 studies); with t_{n-1} for the normal quantile zero-heavy ties at 20 (0.979).
- A known range with every task at an end of it, not all at the same one (pass/fail tasks, one
  attempt each): the tasks at the top are a binomial count and the mean is their share, so the
  mid-p exact interval for a binomial share (Lancaster 1961; Agresti & Gottard 2005, Stat.
  Sci.): Clopper-Pearson's with half the observed count's probability in each tail, at any
  number of tasks. The rules above covered such values 0.998 at 5 tasks and 0.9752 at 20
  (exact, success rate 0.3); this 0.9692 / 0.9474 (0.973 / 0.961 / 0.944 at 3 / 10 / 40 as
  before), over success rates 0.05-0.9 at 3-40 tasks 0.937-0.993 (before 0.925-1.000), and
  the other shapes' samples that happen to be all 0 or 1 move zero-heavy ties at 3 tasks from
  0.999 to 0.994, the rest of the table not at all.
- A known range, no task at an end, fewer than LOG_SCALE_MAX_TASKS = 10 tasks and a mean within
  NEAR_END = 30% of the range from an end: the Cox interval on each task's distance from that
  end (x for scores near 0, 1 - x near 1), mapped back. Small samples of bounded scores near an
  end are spread by factors, as log-normal ones are, and the t misses them from above. But where
  those distances' logs are skewed to the left (skewness below LEFT_SKEWED_LOGS = -0.9: one or
  two tasks far nearer the end than the rest, as bounded values trail off), the skew-corrected t.
- Otherwise (a known range, values in its middle or 10 tasks and more): the skew-corrected t.

Fewer than MIN_TASKS = 3 tasks: no interval. With 2 tasks the only interval there is (t on one
degree of freedom, 12.7 standard errors each side; the sample skewness of 2 values is 0) covers
0.913-0.947 depending on the skew, never reliably 95%, and a "95%" beside it would mislead.

Measured coverage of the nominal 95% interval, mean over the 7 checkpoints [lowest, highest]
(40,000 simulated studies each, seeds [4040, tasks, 100 x task sd]; scores lognormal in task, task
x checkpoint, attempt and attempt x checkpoint effects, task sd on the log scale as below; tasks
with 2-4 attempts; tests/analysis/test_coverage.py checks every checkpoint against 95% within the
binomial tolerance at task sd 0.10-0.35, and heavy skew against the values here):

    task sd  2 tasks (t_1)  3 tasks            5 tasks            10 tasks
    0.10     0.947          0.951 [.948-.953]  0.952 [.950-.953]  0.950 [.949-.952]  mild
    0.25     0.944          0.950 [.949-.951]  0.950 [.949-.952]  0.950 [.949-.952]
    0.35     0.942          0.951 [.950-.952]  0.950 [.949-.951]  0.950 [.948-.951]  RE-Bench
    0.80     0.913          0.951 [.950-.951]  0.951 [.949-.952]  0.949 [.948-.951]  heavy

The Cox interval (before, other seeds) covered 0.950 / 0.950 / 0.950 at sd 0.10, 0.947 / 0.948 /
0.949 at 0.35 and 0.937 / 0.940 / 0.945 at 0.80. The previous default before it, Hall's t alone,
covered 0.936 / 0.930 / 0.939 at 3 / 5 / 10 tasks with task sd 0.35 and 0.891 / 0.884 / 0.908 with
0.80; the plain t 0.931 / 0.923 / 0.929 and 0.878 / 0.856 / 0.872 (benchmarks/coverage_study.py,
8,000 studies).

benchmarks/coverage_study.py compares the methods on RE-Bench-like best-so-far scores that stay
exactly 0 until an attempt beats the starting solution (8,000 studies, no known range): at the
first checkpoint all 3 tasks are often still at 0, the interval is then the point 0, and no
method covers there (0.667 at 3 tasks, 0.832 at 5, 0.920 at 10 for the default; 0.67-0.92 for the
others). From the third checkpoint on the default covers 0.932-0.960 (measured with the Cox
interval as the default; with the profile likelihood, 8,000 studies, the lowest checkpoint 0.658 /
0.831 / 0.920 and the mean over checkpoints 0.897 / 0.921 / 0.941). (A participant's failure
now scores at the floor, so scored tasks' zeros are common: a tie at 0 gives no interval, see
below.)

Bounded rubric fractions in [0, 1] (PaperBench-like; logistic in progress minus task difficulty,
task sd on the logit scale 0.5-1.5, 2-4 attempts, 7 checkpoints; tests/analysis/test_coverage.py,
8,000 studies), with the known range: mean over checkpoints [lowest-highest]

    task sd   3 tasks              5 tasks              10 tasks
    0.5       0.952 [.942-.960]    0.952 [.947-.960]    0.945 [.934-.953]
    1.0       0.953 [.937-.962]    0.957 [.942-.966]    0.943 [.915-.957]
    1.5       0.955 [.928-.968]    0.963 [.937-.973]    0.944 [.897-.966]

(seeds 300 + tasks; at 5 tasks before the left-skewed logs took the skew-corrected t: 0.954
[.948-.961], 0.961 [.948-.969], 0.967 [.943-.976]; at 7 tasks 0.956 / 0.964 / 0.973 then, 0.952
[.946-.961] / 0.959 [.943-.967] / 0.966 [.947-.976] now.)

At 10 tasks the first checkpoint (true mean 0.05, logit-normal values near 0) falls short: the
skew-corrected t serves from 10 tasks on because the log scale collapses on other shapes there.
Without the known range (the Cox interval on the values themselves) 3 tasks covered 0.937-0.944
and 10 tasks over-covered, 0.959-0.973; with the profile likelihood now used there 0.935-0.947 and
0.957-0.969 (mean over checkpoints, benchmarks/coverage_study.py, 8,000 studies).

Paired differences between two groups (crossover table, planner): `paired_interval`, over the
tasks both groups have at the checkpoint. A difference has no fixed sign, so no log scale of its
own, and the skew-corrected t on the differences alone falls short where they are skewed by one
group's heavy tail (0.79 at 5 tasks, lognormal 1.2 vs 0.5 below): a small sample rarely shows
the tail, and its skewness then says nothing about it. MOVER, the method of variance estimates
recovery (Zou & Donner 2008, Stat. Med.; the correlation term for dependent estimates as in
Zou 2007, Psychol. Methods, and Newcombe's 1998 paired proportions; for log-normal means Zou,
Taleban & Huo 2009, Comput. Stat. Data Anal.), rebuilds the difference's interval from
each group's own interval [l, u] around its mean m and the correlation r of the groups' task
values:

    lower = (m_b - m_a) - sqrt((m_b - l_b)^2 + (u_a - m_a)^2 - 2 r (m_b - l_b)(u_a - m_a)),

and the upper bound likewise from b's upper and a's lower reach. Each group's interval brings
what is known about its shape (its log scale, its range) that the differences hide; with plain
t-intervals for both groups and the Pearson r it is exactly the paired t. MOVER takes r as known,
and over 3-5 tasks a Pearson r near 1 mostly says that one task sits at 0 for both groups (a task
hard for both), not that their errors cancel: at r = 1 the interval shrinks to the gap between
the groups' reaches, and zero-inflated pairs covered 0.910 at 3 tasks, missing 36% of the samples
with one task at 0 in each group. So r is held to MAX_MOVER_CORRELATION = 0.95, where two equal
reaches keep sqrt(2 (1 - 0.95)) = 0.32 of their width (0.952 / 0.961 at 3 / 5 zero-inflated
tasks; held to 0.97 0.936 / 0.944, to 0.9 0.972 / 0.978). Per shape:

- No known range: MOVER from the groups' own intervals (the Cox interval where all of a group's
  values are above 0, else skew-corrected), each side held to MAX_MOVER_STRETCH = 3 t half-widths of
  the differences: where the groups move together their asymmetries cancel in the differences
  and MOVER would add them (tasks from 0.05 to 3, one group 0.1 ahead on each: [-4.7, 4.8] uncapped,
  wider than a group's own interval, for a gap the differences pin to 0.07-0.13). And r is at
  most what a bivariate log-normal model implies from the logs (`_log_normal_correlation`),
  (e^(r_log s_a s_b) - 1) / sqrt((e^(s_a^2) - 1) (e^(s_b^2) - 1)), r_log and s the logs'
  correlation and standard deviations: over 3-10 skewed tasks the Pearson r of the values
  follows the task where both groups score highest, near 1 where that one task dominates both
  samples, and the interval shrank most where the sample says least about a heavy tail. With the
  Pearson r alone lognormal 1.2 vs 0.5 covered 0.909 / 0.892 / 0.929 at 3 / 5 / 10 tasks, its
  upper bound below the truth in 2.6% / 3.6% / 0.9% of studies (0.4% / 0.2% / 0.1% now).
- A known range with some task of either group at an end of it (zero-inflated scores): MOVER
  from the groups' t-intervals held inside the range, a group whose tasks all sit at an end
  entering with its exact bound (below). Where no group ties, no bound binds and r is under
  0.95 this is the paired t itself; the gain is what the range says about each group (at 3
  zero-inflated tasks the plain t on the differences covers 0.80, this 0.95).
- A known range, no task at an end: the skew-corrected t on the differences (it holds there).

Measured on the pairs of benchmarks/coverage_shapes.py (second table: two groups' task values
linked by a Gaussian copula, correlation 0.7, [0, 1] range known for all but the log-normal
pairs; 20,000 studies per cell): coverage, median width over the plain t on the differences,
the plain t's coverage in brackets; the skew-corrected t on the differences used before below:

    pair                      3 tasks              5 tasks              10 tasks
    zero-inflated 60% vs 40%  0.952 0.55x (.798)   0.961 0.90x (.862)   0.933 1.00x (.932)
    beta(0.5, 3) vs (1, 3)    0.945 1.11x (.945)   0.942 1.04x (.946)   0.942 1.02x (.948)
    beta(2, 2) vs (2, 2)      0.955 1.10x (.954)   0.952 1.03x (.953)   0.949 1.01x (.951)
    lognormal 0.8 vs 0.8      0.978 2.30x (.972)   0.973 2.09x (.972)   0.972 1.71x (.969)
    lognormal 1.2 vs 0.5      0.933 1.98x (.862)   0.931 1.92x (.784)   0.942 1.89x (.787)

    pair                      20 tasks             40 tasks
    zero-inflated 60% vs 40%  0.948 1.00x (.948)   0.948 1.00x (.948)
    beta(0.5, 3) vs (1, 3)    0.942 1.01x (.950)   0.946 1.00x (.950)
    beta(2, 2) vs (2, 2)      0.950 1.00x (.951)   0.950 1.00x (.950)
    lognormal 0.8 vs 0.8      0.966 1.40x (.958)   0.967 1.24x (.958)
    lognormal 1.2 vs 0.5      0.950 1.63x (.812)   0.957 1.37x (.850)

    skew-corrected t on the differences (before): zero-inflated 0.850 / 0.876 / 0.935 / 0.951 /
    0.949; lognormal 0.8 vs 0.8 0.973 / 0.966 / 0.938 / 0.921 / 0.922; lognormal 1.2 vs 0.5
    0.866 / 0.789 / 0.814 / 0.856 / 0.894; the bounded continuous pairs as above.

Still outside [0.93, 0.975]: lognormal 0.8 vs 0.8 at 3 tasks, over (0.978), the price of the
log-normal bound on r (0.969 with the Pearson r alone). 1.2 vs 0.5 is inside at 0.931-0.957; its
remaining misses (lower bounds above the truth in 6% of studies at 3-10 tasks) come from the Cox
interval's own shortfall on the sd-1.2 group (0.921-0.938 on its own). Measured with the log-normal
bound and rejected (20,000 studies): the log-normal r alone, not the smaller of it and Pearson's,
0.932 / 0.928 / 0.939 at 3 / 5 / 10 tasks (0.8 vs 0.8 0.977 / 0.970 / 0.966); the mean of the two
0.927 / 0.921 / 0.937 (0.974 / 0.964 / 0.957); the log-normal bound held at 0 or above (a
negative one from 3 logs is noise, not a dominant task) no change in either pair at 3 / 5 / 10
tasks, the third decimal included; each side held to 2.5 or 2.75 t half-widths 0.927 /
0.922 or 0.931 / 0.927 at 3 / 5 tasks, 0.8 vs 0.8 at 3 tasks 0.977 whatever the cap (its misses are
not the cap's); to 3.5 0.938 / 0.935 at 2.19 / 2.14x the t's width (0.8 vs 0.8 2.51x). Measured with
the Pearson r alone on 1.2 vs 0.5 and rejected: the groups entering with the profile-likelihood
interval that serves a group on its own (4,000 studies) 0.938 / 0.917 / 0.901 at 3 / 5 / 10 tasks,
with lognormal 0.8 vs 0.8 at 0.978 / 0.970 / 0.956 and 2.71 / 2.62 / 2.15x the t's width (its lower
reach for the sd-1.2 group is shorter than Cox's, and the difference's upper bound pairs with it);
each group entering with Cox's lower and the profile's upper reach (the wider of the two on each
side) 0.942 / 0.930 / 0.941, but 0.8 vs 0.8 at 0.983 / 0.974 / 0.959 and 2.68 / 2.58 / 2.12x; the
groups entering with the log-normal mean's MOVER interval (chi-square for the log variance; 4,000
studies, r not held) 0.948 / 0.938 / 0.944 at 3 / 5 / 10 tasks, but lognormal 0.8 vs 0.8 0.988 /
0.983 / 0.966 at 2.3-2.8x the t's width; the cap at 5 or no cap on the t half-widths 0.912-0.917 /
0.894-0.895 at 3 / 5 tasks; r held to 0.8 0.931 / 0.920, with 0.8 vs 0.8 at 0.987 / 0.975; the
generalised pivotal quantity of the difference of two bivariate log-normal means (Wishart pivot on
the logs' sums of squares, symmetric roots so that it swaps sign with the groups, fixed draws, each
side held to 3 t half-widths as MOVER's; 20,000 studies) 0.953 / 0.934 / 0.938, but 0.8 vs 0.8 at
3.00 / 3.00 / 2.21x the t's width (MOVER's 2.27 / 2.02 / 1.61x) and the paired log-normal model
below at task sd 0.10 over the target at 3 and 5 tasks (0.982 [.970-.990], 0.973; 4,000 studies):
uncapped it covers about 0.95 everywhere, at a median width of e^70 times the t's at 3 tasks and 96
times at 5, so over 3-5 tasks the cap, not the pivot, sets its coverage; a floor of 1.75-2.5 t
half-widths on the side of the group whose logs spread more gave 0.918-0.928 at 3 tasks, or widened
0.8 vs 0.8 to 1.87x at 10.
The width target (at most 1.1x the plain t where the t is valid) is missed on symmetric heavy-tailed
differences of unbounded scores (lognormal 0.8 vs 0.8: the t covers 0.958-0.972 there, MOVER is
2.30x its width at 3 tasks falling to 1.24x at 40): each group is skewed there as in 1.2 vs 0.5,
where the t on the differences covers 0.784-0.862, and 3-5 tasks do not show which of the two a
study is; the interval that is narrow on one misses on the other. On the log-normal model above
(both groups with the same task effects, one group's curve reversed, 8,000 studies, seed 505 + 100 x
task sd, plus 1,000 x tasks at 3 and 10; mean over checkpoints, lowest-highest):

    task sd  3 tasks                   5 tasks                   10 tasks
    0.10     0.953 [.950-.961] (.950)  0.951 [.947-.960] (.946)  0.951 [.947-.954] (.945)
    0.35     0.950 [.944-.971] (.941)  0.948 [.942-.964] (.934)  0.952 [.945-.960] (.939)
    0.80     0.926 [.902-.989] (.899)  0.930 [.894-.989] (.896)  0.941 [.919-.981] (.911)

(the skew-corrected t on the differences in brackets), at 1.01-1.02x its median width at task sd
0.10, 1.06-1.17x at 0.35 and 1.25-1.40x at 0.80; with the Pearson r alone (before) 0.952 / 0.951 /
0.950, 0.948 / 0.946 / 0.949 and 0.922 / 0.925 / 0.937, at 1.00-1.01x, 1.05-1.16x and 1.25-1.39x;
with r not held at all 0.951 / 0.950 / 0.950, 0.943 / 0.945 / 0.949 and 0.907 / 0.917 / 0.935 on
the same seeds.

Two rules keep an interval from claiming more than the data show. Scores with a known range
(rubric and EXP-Bench scores in [0, 1]; paired differences of them in [-1, 1]) get bounds inside
that range: a bound outside it is certainly wrong. And a sample without spread (every task the
same value, as early checkpoints often are) is never a zero-width "95%" interval: at the floor
of a known range it gets the exact bound [0, 1 - alpha^(1/n)] (for X in [0, 1], P(X = 0) <= 1 -
mean, so n zeros have probability at most alpha when the mean is above that bound; 0.63 at 3
tasks), at the ceiling its mirror image, and anywhere else no interval, labelled as such.

The shapes real benchmarks produce (issue 37), one value per task, [0, 1] range known for all
but the log-normal ones; `python benchmarks/coverage_shapes.py` (20,000 studies per cell, shapes
in tests/analysis/score_shapes.py; coverage and median width over the plain t-interval's):

    shape                     3 tasks       5 tasks       10 tasks      20 tasks      40 tasks
    zero-inflated bimodal     0.974 0.43x   0.991 0.79x   0.948 1.00x   0.964 0.88x   0.952 0.94x
    beta(0.5, 3)              0.952 1.49x   0.963 2.20x   0.935 1.10x   0.956 1.08x   0.954 1.05x
    beta(2, 2)                0.961 0.91x   0.963 1.03x   0.959 1.01x   0.961 1.00x   0.955 1.00x
    lognormal sd 0.8          0.950 2.19x   0.949 2.23x   0.952 1.54x   0.953 1.27x   0.949 1.14x
    lognormal sd 1.2          0.940 2.17x   0.941 2.25x   0.950 2.29x   0.950 1.73x   0.949 1.37x
    beta tasks, attempts x1   0.955 0.90x   0.961 1.15x   0.955 1.05x   0.963 1.03x   0.959 1.02x
    beta tasks, attempts x4   0.969 1.03x   0.969 1.31x   0.953 1.03x   0.957 1.02x   0.954 1.01x
    beta tasks, attempts x8   0.967 1.06x   0.966 1.37x   0.954 1.03x   0.958 1.02x   0.954 1.01x
    zero-heavy ties           0.994 0.62x   0.999 0.68x   0.998 0.83x   0.963 0.97x   0.946 0.99x
    bimodal 0/1 attempts x1   0.972 0.30x   0.971 0.55x   0.962 0.78x   0.946 0.89x   0.945 0.94x
    bimodal 0/1 attempts x4   0.985 0.53x   0.913 0.79x   0.930 1.00x   0.943 0.89x   0.948 0.95x
    bimodal 0/1 attempts x8   0.903 0.61x   0.903 0.83x   0.930 1.00x   0.939 0.90x   0.948 0.95x

From 20 tasks the rows with tasks at 0 (zero-inflated, zero-heavy ties, 0/1 attempts) are the
Wilson score interval on the effective number of tasks; with the plain t there (before) they were
0.951 / 0.948, 0.904 / 0.900, 0.946 / 0.933, 0.940 / 0.945 and 0.939 / 0.946 at 20 / 40 tasks, at
1.00x its width. On 0/1 attempts x1 (binary task values, n + 1 possible samples) the coverage is
exact by enumeration: with the mid-p interval 0.9474 / 0.9443 at 20 / 40 tasks; with the
effective-tasks Wilson (before) 0.9752 / 0.9443, 0.0002 above the target at 20 tasks (Wilson's
coverage oscillates with n and p on binomial counts, Brown, Cai & DasGupta 2001, as every
interval's does on a lattice); Jeffreys's interval on the effective number of tasks for every
sample with a task at an end (0.947 there) put zero-heavy ties at 0.977 / 0.929.

(Before the known range was used: beta(0.5, 3) 0.942 / 0.971 / 0.991 / 0.972 / 0.741, beta(2, 2)
0.945-0.981 at widths 1.15-1.46x from 5 tasks on, beta tasks with beta attempts 0.60 at 40.)

The log-normal rows are the profile-likelihood interval; with the Cox interval (before) they were
0.938 / 0.938 / 0.945 / 0.949 / 0.948 at 2.16 / 1.55 / 1.29 / 1.18 / 1.10x (sd 0.8) and 0.921 /
0.923 / 0.938 / 0.945 / 0.944 at 2.18 / 2.26 / 1.85 / 1.48 / 1.27x (sd 1.2): Cox's misses were
samples that understate the spread (36% of 3-task samples at sd 1.2 show a log sd under 0.8 and held
97% of its misses, all above the upper bound), and its s^2 / 2 is taken as the mean's offset. The
profile likelihood asks instead how far theta may go before the data, at the best sigma for that
theta, become unlikely, and a small sample's likelihood stays flat towards large sigma: its upper
bound reaches far where few tasks show little spread, and it stays near the t-interval on the logs
where they show it small (task sd 0.10-0.35 at 95% above). Where the t is not valid (it covers
0.87-0.91 at sd 0.8, 0.77-0.86 at 1.2, 3-40 tasks) it is wider: 1.54x the t at 10 tasks of sd 0.8,
2.29x at sd 1.2. Measured and rejected besides, at 3 / 5 tasks (4,000 studies): the log-normal
mean's MOVER interval (Zou, Taleban & Huo 2009) 0.956 / 0.959 at sd 1.2, but 0.960-0.962 at 3
RE-Bench-like tasks and 0.961-0.971 at sd 0.8; Cox's lower bound with the generalised
(Krishnamoorthy & Mathew 2003) upper one 0.974 at sd 1.2, 0.970 at 0.35; the generalised interval
alone 0.933 at sd 1.2, 0.930 at 0.8; MOVER where the sample's log sd is above 0.8 or 1.0
0.915-0.928; a parametric bootstrap-t of Cox's statistic calibrated at sigma = s 0.928 / 0.917 (Cox
on the same seeds 0.928 / 0.916), at the median-unbiased sigma 0.910 / 0.910; the Bayesian interval
with a flat prior on mu and a half-normal one on sigma: scale 1.0 0.940 / 0.936 at sd 1.2 but 0.985
/ 0.970 at sd 0.10 and 0.971 / 0.962 at 0.35 on the model above, scale 0.5 0.795 / 0.845 at sd 1.2
with 0.973 at sd 0.10 (no scale holds both: the prior widens small-sigma samples from either
population alike); the profile likelihood with the chi-square calibration 0.852 / 0.894 at sd 1.2,
0.854 / 0.903 at sd 0.10.

No interval is ever zero-wide; where the t is valid (beta(2, 2), beta tasks from 10 on) the
width is within 1.06x of it. Still outside [0.93, 0.975], with what stands in the way:

- Lattices with most mass at 0, 3-10 tasks. Exact coverage by enumerating every sample (the
  shapes' probabilities are known; these agree with the table within its binomial error):
  - zero-heavy ties (0.994 / 0.999 / 0.998): at 3 tasks 61.4% of samples are all 0 (the exact
    bound must cover them: truth 0.1 < 0.63) and 32.5% have two tasks at 0 and a mean of at
    least 0.17 (an interval with its lower bound at or below 0.1, as two tasks at 0 demand,
    covers); that is 0.939, and under 0.975 would need misses in 41% of the remaining 6.1% (one
    task at 0, e.g. (0, 0.5, 0.5)), lower bounds above 0.1 where a task sits at 0 and 3 values
    are all there is. At 5 tasks the same two kinds hold 0.974 (every sample with a task above 0
    has a mean of at least 0.1), leaving 0.027 to miss 0.025 of. At 10 tasks the Wilson interval
    on effective tasks gives 0.970 but moves zero-inflated values to 0.986 (4,000 studies).
  - 0/1 attempts x8 at 3 tasks (0.903; exact 0.899 over all samples): the single sample
    (0, 0, 1/8) holds 6.3% of studies (t: [0, 0.221], truth 0.3), (0, 1/8, 1/8) 2.0%. An interval
    whose upper bound does not fall when a task's value rises and that covers the first also
    covers the second: 0.982; one that misses the first is at most 0.937 even if it missed
    nothing else (today it misses (5/8, 7/8, 1) and the like from below too). In reach only in
    [0.930, 0.937], by covering (0, 1/8, 1/8) (upper bound 3.6x its mean) but not (0, 0, 1/8)
    (7.2x) and every high sample; measured alternatives land on either side: Wilson on the
    share above 0 times the t for the values above it, combined by MOVER on the log scale (a
    zero-inflated, "delta" model) 0.985, the effective-tasks Wilson 0.883 with the normal
    quantile and 0.989 with t_2.
  - 0/1 attempts x4 at 5 tasks (0.913; exact 0.913): (0, 0, 0, 0, 1/4) holds 4.8%, (0, 0, 0, 1/4,
    1/4) 3.1%; covering the first covers both (0.992, measured 0.992 for the delta model), not
    covering the first caps it at 0.952. x8 at 5 tasks (0.903) has its misses spread over many
    samples (the largest 1.8%): in reach in principle, but the delta model (0.958 there) moves
    x4 at 5 tasks to 0.992 and x8 at 3 to 0.985, the effective-tasks Wilson gives 0.896 / 0.951.
- Over-coverage where the interval is wider than the data need. Beta tasks with beta attempts at
  5 tasks are now inside (0.961-0.969; they were 0.979-0.982 at 1.44-1.57x the t's width, and
  0.982-0.988 at 6-9 tasks, 0.959-0.968 now): their log scale on the distance from 0 over-reached
  for samples whose logs trail off to the left, which now take the skew-corrected t. Measured and
  rejected before that, as caps that cannot tell the shapes apart: holding the log scale's upper
  bound to 2 t half-widths (0.957-0.971, but beta(0.5, 3) at 3 tasks 0.919), to 2.5 (0.962-0.975,
  4,000 studies), to 2 or 2.5 of the skew-corrected t's upper reach (rubric-like scores of task sd
  1.5 at 3 tasks 0.895 / 0.908 at the first checkpoint), to the t-interval with the sd at its
  one-sided 95% chi-square upper limit (x4 0.0001 over, rubric-like scores of task sd 1.5 at 5
  tasks 0.917 at the first checkpoint). Still over: zero-inflated values at 5 (0.991; every
  alternative above measured 0.990: the count of tasks above 0 is binomial(5, 0.4), and even an
  oracle knowing the nonzero tasks' mean 0.8, with Wilson's or Clopper-Pearson's interval for the
  share above 0, covers 0.990 = 1 - 0.4^5, missing only the 5-of-5 samples: under 0.975 it would
  need a lower bound above the truth at 4 of 5 tasks above 0, tighter than Wilson's 0.376 for the
  share there) and 0/1 attempts x4 at 3 (0.985). (0/1 attempts x1 was over at 5 and 20 tasks,
  0.998 and 0.9752, before binary values took the mid-p interval: inside now.)

So the interval over scores holds 95% within [0.93, 0.975] on continuous scores from 3 tasks on
(log-normal sd 0.8 and 1.2 included, 0.940-0.953, where the plain t misses by 7-10 points, and beta
tasks with beta attempts), on binary task values from 3 tasks on, and on every shape from 20 tasks
on, over-covers on lattices of scores piled at 0 where few samples are possible, and falls short
where the data cannot show any spread (every task still at 0 early on, no known range). The paired
difference's interval holds within [0.93, 0.975] on every pair measured from 3 tasks on except
symmetric log-normal groups at 3 tasks, over (0.978, at 2.30x the t's width).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize, stats

from analysis.bootstrap import FloatArray, IntArray

BoolArray = npt.NDArray[np.bool_]
StrArray = npt.NDArray[np.str_]

LOG_METHOD = "profile likelihood for the log-normal mean over tasks (t-calibrated)"
END_LOG_METHOD = "log-scale (Cox) t on each task's distance from the nearer end of the score range"
SKEW_METHOD = "skew-corrected t over tasks"
PLAIN_METHOD = "t over tasks (some task at an end of the score range)"
WILSON_METHOD = (
    "Wilson score interval on the effective number of tasks (some task at an end of the score "
    "range, 20 tasks or more)"
)
BINARY_METHOD = (
    "mid-p exact interval for the share of tasks at the top of the score range (every task at "
    "an end of it)"
)
NO_INTERVAL = "no interval (fewer than 3 tasks)"
TIED = "no interval (every task has the same value: no spread to measure)"
EDGE_BOUND = "exact bound (every task at the end of the score range)"
MOVER_LOG_METHOD = (
    "paired difference over tasks: MOVER from each group's own interval (log-scale where its "
    "tasks are all above 0) and their correlation (at most 0.95, and at most what a log-normal "
    "model implies from their logs), at most 3 t half-widths of the differences"
)
MOVER_T_METHOD = (
    "paired difference over tasks: MOVER from each group's t-interval held inside the score "
    "range (its exact bound where all its tasks sit at an end) and their correlation (at most 0.95)"
)
PAIRED_METHOD = (  # no apostrophes: the portal quotes it inside METHOD_DETAIL, HTML-escaped
    "paired differences over the tasks both groups have: MOVER (Zou & Donner 2008) combining the "
    "intervals of the two groups with the correlation of their task values (at most 0.95); "
    "without a known score range from the interval of each group on its own (log-scale where all "
    "its tasks are above 0) and a correlation at most what a bivariate log-normal model implies "
    "from the logs, each side at most 3 t half-widths of the differences; on a known "
    "range with some task at an end of it from the t-intervals of the groups held inside the "
    "range (a group with every task at an end: its exact bound); otherwise the skew-corrected t "
    "on the differences; none under 3 tasks or when every task has the same difference; held "
    "inside the range of the differences"
)
METHOD = (
    "over tasks: on a known score range, the plain t where a task sits at an end of it (from 20 "
    "tasks the Wilson score interval on the effective number of tasks; where every task sits at "
    "an end, the mid-p exact interval for the share at the top), the log-scale "
    "(Cox) t on the distance from the nearer end for a mean near it under 10 tasks (unless "
    "the logs of those distances are skewed to the left), else the skew-corrected t; without "
    "a known range the profile-likelihood interval for the log-normal mean where all tasks "
    "are above 0, else the skew-corrected t; none under 3 "
    "tasks or when every task ties (at the end of a known range: the exact bound); held "
    "inside a known score range"
)
METHOD_DETAIL = (
    "scores with a known range (rubric and EXP-Bench scores in [0, 1]): where some task value "
    "sits at an end of the range, the plain t-interval over task values (df = tasks - 1), from "
    "20 tasks on the Wilson score interval for the mean on the effective number of tasks "
    "(tasks over the design effect, the sample variance over the largest the mean allows); where "
    "every task value sits at an end (pass or fail), the mid-p exact interval for the binomial "
    "share of tasks at the top (Lancaster 1961); under "
    "10 tasks whose mean lies within 30% of the range from an end, the modified Cox interval for "
    "the mean of log-normal values on the distances from that end, unless the logs of those "
    "distances have a skewness below -0.9 (one or two tasks far nearer the end than the rest); "
    "otherwise the t-interval with the Hall (1992) skewness correction. Scores without a known "
    "range: where every task value is above 0 the profile-likelihood interval for the mean of "
    "log-normal values, calibrated so that on a normal mean it is the t-interval, else the "
    "skew-corrected t. Fewer than 3 tasks: no interval (none holds 95% "
    "with skewed scores there); every task the same value: no interval, except at an end of a "
    "known range, where the exact bound [0, 1 - alpha^(1/n)] (or its mirror) holds; bounds held "
    "inside a known range; no resampling, so no Monte Carlo error. Paired differences between "
    "groups: " + PAIRED_METHOD
)
MIN_TASKS = 3  # fewer tasks give no interval: at 2, no method holds 95% with skewed scores


@dataclass(frozen=True)
class TaskInterval:
    """Mean over tasks and its interval, per column; NaN bounds where fewer than MIN_TASKS."""

    mean: FloatArray
    lo: FloatArray
    hi: FloatArray
    n_tasks: IntArray
    kind: IntArray  # the method of each column: an index into _KINDS
    tied: BoolArray  # every task has the same value: no t-interval (see TIED, EDGE_BOUND)

    def methods(self) -> StrArray:
        """The method of each column's interval, in the words shown beside it."""
        named = np.asarray(_KINDS)[self.kind]
        tied = np.where(np.isnan(self.lo), TIED, EDGE_BOUND)
        named = np.where(self.tied, tied, named)
        return np.where(self.n_tasks >= MIN_TASKS, named, NO_INTERVAL)


_SKEW, _LOG, _END_LOG, _PLAIN, _MOVER_LOG, _MOVER_T, _WILSON, _BINARY = range(8)
_KINDS = (
    SKEW_METHOD,
    LOG_METHOD,
    END_LOG_METHOD,
    PLAIN_METHOD,
    MOVER_LOG_METHOD,
    MOVER_T_METHOD,
    WILSON_METHOD,
    BINARY_METHOD,
)
# On a known range, the log scale serves task values near an end of it, spread by factors (0.02,
# 0.1, 0.3 of the way) as small samples of skewed bounded scores are: where the mean over tasks
# lies within NEAR_END of the range from an end. Nearer the middle the values have room on both
# sides, and the skew-corrected t holds there at a width within 1.02x the plain t's (beta(2, 2),
# 5 tasks). The switch looks at the mean only: switching on the sample's spread picked the t
# exactly for the samples that understate it (0.69 coverage among them on rubric-like scores).
# From LOG_SCALE_MAX_TASKS on the skew correction holds alone, and the log scale would mislead:
# bounded values near an end are not log-normal (their logs trail off towards minus infinity),
# and with 40 beta(0.5, 3) tasks the log-scale interval covered 0.745 (coverage table above).
# Under LOG_SCALE_MAX_TASKS a sample can show the same: logs skewed to the left (skewness below
# LEFT_SKEWED_LOGS, one or two tasks far nearer the end than the rest) are not log-normal, and the
# log scale's variance, set by those tasks, reaches far above a mean the other tasks pin down
# (beta tasks with beta attempts at 5 tasks covered 0.979-0.982, at 6-9 tasks 0.982-0.988).
# Such samples get the skew-corrected t (0.959-0.969 there, 20,000 studies; rubric-like scores
# 0.002-0.004 lower at 5 tasks, their lowest checkpoint 0.937, and closer to 95% at 6-9). Three
# or four values never reach it: their sample skewness is at most 0.38 and 0.75 in size.
NEAR_END = 0.3
LOG_SCALE_MAX_TASKS = 10
LEFT_SKEWED_LOGS = -0.9
MAX_STRETCH = 2.0  # the skewness correction may at most double one side of the t-interval
# The log-scale upper bound runs off (e^50 and beyond) when one task's value is near 0; held to
# 4 plain t half-widths, it loses under 0.0002 coverage even with heavy skew (task sd 0.8).
MAX_LOG_STRETCH = 4.0
PROFILE_REACH = 64.0  # the profile bounds are searched within e^64 of the estimate (then capped)
PROFILE_STEPS = 48  # bisection steps: 128 / 2^48, far below any bound's rounding
# MOVER without a known range borrows each group's log-scale asymmetry; where the groups move
# together the asymmetries cancel in the differences and MOVER would add them (tasks from 0.05 to
# 3, one group 0.1 ahead on each: [-4.7, 4.8], wider than a group's own interval). Each side is
# held to 3 t half-widths of the differences (named in MOVER_LOG_METHOD); at 2 the lognormal
# 1.2 vs 0.5 pair covered 0.867 at 5 tasks, at 3 0.888, uncapped 0.894 (8,000 studies).
MAX_MOVER_STRETCH = 3.0
# MOVER takes the groups' correlation as known; over 3-5 tasks a Pearson r near 1 comes from one
# task where both groups sit at 0, not from groups whose errors cancel, and at r = 1 the interval
# shrinks to the gap between the groups' reaches (0.910 at 3 zero-inflated tasks, 36% misses where
# each group has one task at 0). Held to 0.95, equal reaches keep sqrt(2 (1 - 0.95)) = 0.32 of
# their width: 0.952 / 0.961 at 3 / 5 tasks; at 0.97 0.936 / 0.944, at 0.9 0.972 / 0.978.
MAX_MOVER_CORRELATION = 0.95
# From WILSON_MIN_TASKS tasks on, values with some task at an end of a known range get the Wilson
# score interval on the effective number of tasks instead of the plain t: where most tasks sit at
# 0 the t misses high values of the mean (0.90 on zero-heavy ties at 20 and 40 tasks). Under 20
# tasks the design effect is estimated from too few values and the samples are few: at 10 tasks
# it over-covered zero-inflated values (0.986, 4,000 studies) where the plain t holds (0.948).
WILSON_MIN_TASKS = 20


@functools.lru_cache(maxsize=256)
def _max_skew_term(q: float) -> float:
    """The largest |a| for which the correction stretches a side of the interval by at most
    MAX_STRETCH. Near |a| (q + |a| / 6) = 1 Hall's f flattens and its inverse runs off to
    infinity: one low task among four similar ones then gave a lower bound 9 standard errors
    away. Capping |a| keeps the correction a correction."""
    target = MAX_STRETCH * q

    def excess(a: float) -> float:
        return float(_hall_inverse(q, np.array([-a]))[0]) - target

    upper = 1.0 / q  # at a = 1/q - tiny, the inverse is already past any finite stretch
    return float(optimize.brentq(excess, 1e-9, upper * (1 - 1e-9)))


def _hall_inverse(q: float, a: FloatArray) -> FloatArray:
    """The T solving f(T) = q for Hall's transformation (closed form: f is a shifted cube)."""
    safe = np.where(np.abs(a) > 1e-12, a, 1.0)
    solved = 3.0 / safe * (np.cbrt(1.0 + safe * (q - safe / 6.0)) - 1.0)
    return np.where(np.abs(a) > 1e-12, solved, q)


def task_interval(
    per_task: FloatArray,
    level: float = 0.95,
    *,
    log_scale: bool = True,
    bounds: tuple[float, float] | None = None,
    profile: bool = True,
) -> TaskInterval:
    """Interval for the mean over tasks of `per_task[..., tasks, columns]`, NaN = no value.

    Without `bounds`, columns whose task values are all above 0 get the log-scale interval, the
    others the skew-corrected t. With `bounds` (the scores' known range) a column with a task at
    an end of the range gets the plain t, one of widely spread values under LOG_SCALE_MAX_TASKS
    tasks the log-scale interval on the distances from the nearer end, the others the
    skew-corrected t; the interval is held inside the range. `log_scale=False` (the
    differences inside `paired_interval`, whose sign is not fixed; the coverage study, to
    compare) gives the skew-corrected t everywhere. `profile=False` gives the Cox interval
    instead of the profile-likelihood one where all values are above 0 without a known range
    (the groups' intervals MOVER combines in `paired_interval`: module docstring). A column
    where every task has the same value gets no interval, or, at an end of `bounds`, the exact
    bound for that end (module docstring).
    Vectorised over any leading axes (simulation tests pass thousands of studies at once).
    """
    if not 0 < level < 1:
        raise ValueError("level must lie strictly between 0 and 1")
    if bounds is not None and not bounds[0] < bounds[1]:
        raise ValueError(f"bounds must be (low, high) with low < high, got {bounds!r}")
    x = np.asarray(per_task, dtype=np.float64)
    present = ~np.isnan(x)
    n = present.sum(axis=-2)
    mean, sd, skew = _moments(x, present, n)
    kind = np.full(mean.shape, _SKEW, dtype=np.int64)
    # The log scale works on distances from an origin: 0 without a known range, else the nearer
    # end of the range (measured downwards from the top when the mean is in its upper half).
    origin, mirrored = np.zeros(mean.shape), np.zeros(mean.shape, dtype=bool)
    if log_scale and bounds is None:
        kind[np.all(np.where(present, x, 1.0) > 0, axis=-2)] = _LOG
    elif log_scale and bounds is not None:
        low, high = bounds
        mirrored = mean > (low + high) / 2
        origin = np.where(mirrored, high, low)
    distance = np.where(np.expand_dims(mirrored, -2), -1.0, 1.0) * (x - np.expand_dims(origin, -2))
    d_mean, d_sd, _ = _moments(distance, present, n)
    if log_scale and bounds is not None:
        with np.errstate(invalid="ignore"):
            near_end = d_mean < NEAR_END * (high - low)
        kind[near_end & (n < LOG_SCALE_MAX_TASKS)] = _END_LOG
        kind[np.any(present & (distance <= 0), axis=-2)] = _PLAIN
        kind[(kind == _PLAIN) & (n >= WILSON_MIN_TASKS)] = _WILSON
    positive = present & (distance > 0)
    log_mean, log_sd, log_skew = _moments(np.log(np.where(positive, distance, 1.0)), present, n)
    kind[(kind == _END_LOG) & (log_skew < LEFT_SKEWED_LOGS)] = _SKEW
    logged = (kind == _LOG) | (kind == _END_LOG)
    lo = np.full(mean.shape, np.nan)
    hi = np.full(mean.shape, np.nan)
    for size in np.unique(n[n >= MIN_TASKS]):
        at = n == size
        df = int(size) - 1
        q = float(stats.t.ppf(1 - (1 - level) / 2, df))
        cap = np.where(kind[at] == _PLAIN, 0.0, _max_skew_term(q))
        a = np.clip(skew[at] / math.sqrt(size), -cap, cap)
        se = sd[at] / math.sqrt(size)
        lo[at] = mean[at] - _hall_inverse(q, a) * se
        hi[at] = mean[at] - _hall_inverse(-q, a) * se
        cox = at & logged
        v = log_sd[cox] ** 2
        centre = log_mean[cox] + v / 2
        half = q * np.sqrt(v / size + v**2 / (2 * df))
        log_lo, log_hi = centre - half, centre + half
        # Without a known range, the profile-likelihood interval for the log-normal mean.
        profiled = (kind[cox] == _LOG) & profile
        log_lo[profiled], log_hi[profiled] = _profile_log_mean(
            log_mean[cox][profiled], v[profiled] * df / size, int(size), q
        )
        t_half = q * d_sd[cox] / math.sqrt(size)
        # The reported estimate stays the plain mean over tasks, so the bounds are held to
        # contain it; the far side at most MAX_LOG_STRETCH plain t half-widths from it.
        with np.errstate(over="ignore"):
            d_lo = np.minimum(np.exp(log_lo), d_mean[cox])
            d_hi = np.clip(np.exp(log_hi), d_mean[cox], d_mean[cox] + MAX_LOG_STRETCH * t_half)
        flip = mirrored[cox]
        lo[cox] = np.where(flip, origin[cox] - d_hi, origin[cox] + d_lo)
        hi[cox] = np.where(flip, origin[cox] - d_lo, origin[cox] + d_hi)
    enough = n >= MIN_TASKS
    with np.errstate(invalid="ignore"):
        tied = enough & (sd <= 1e-12 * np.maximum(1.0, np.abs(mean)))
    if bounds is not None:
        wilson = kind == _WILSON
        lo[wilson], hi[wilson] = _effective_wilson(
            mean[wilson], sd[wilson], n[wilson], level, bounds
        )
        # Every task at an end of the range (pass or fail): a binomial count (module docstring).
        at_end = np.where(present, (x <= bounds[0]) | (x >= bounds[1]), True)
        binary = enough & ~tied & np.all(at_end, axis=-2)
        kind[binary] = _BINARY
        top = np.where(present, x >= bounds[1], False).sum(axis=-2)
        share_lo, share_hi = _mid_p(top[binary], n[binary], level)
        lo[binary] = bounds[0] + share_lo * (bounds[1] - bounds[0])
        hi[binary] = bounds[0] + share_hi * (bounds[1] - bounds[0])
    lo[tied], hi[tied] = np.nan, np.nan
    if bounds is not None:
        low, high = bounds
        lo, hi = np.clip(lo, low, high), np.clip(hi, low, high)
        with np.errstate(invalid="ignore"):
            reach = (high - low) * (1 - (1 - level) ** (1 / np.maximum(n, 1)))
            floor, ceiling = tied & (mean <= low), tied & (mean >= high)
        lo[floor], hi[floor] = low, (low + reach)[floor]
        lo[ceiling], hi[ceiling] = (high - reach)[ceiling], high
    return TaskInterval(mean=mean, lo=lo, hi=hi, n_tasks=n.astype(np.int64), kind=kind, tied=tied)


def _profile_log_mean(
    log_mean: FloatArray, log_var: FloatArray, n: int, q: float
) -> tuple[FloatArray, FloatArray]:
    """The profile-likelihood interval for theta = mu + sigma^2 / 2, the log of a log-normal
    mean, from the logs' mean and maximum-likelihood variance (divisor n): the thetas whose
    likelihood ratio statistic W(theta) = 2 (l(max) - l_p(theta)) is at most
    n log(1 + q^2 / (n - 1)), q the t_{n-1} quantile. That calibration makes the same rule on a
    normal mean exactly the t-interval (its ratio statistic is n log(1 + T^2 / (n - 1))).
    For a given theta the likelihood is largest at sigma^2 = u = 2 (sqrt(1 + s^2 + d^2) - 1),
    d = ybar - theta (setting the derivative in u to 0 leaves u^2 / 4 + u = s^2 + d^2), so
    W is closed-form and each bound is found by bisection (W grows on each side of the
    estimate ybar + s^2 / 2)."""
    c = n * math.log1p(q**2 / (n - 1))
    top = log_mean + log_var / 2
    # Tied logs (variance 0) have no likelihood ratio: NaN bounds, which `task_interval` replaces.
    with np.errstate(divide="ignore", invalid="ignore"):
        l_max = -n / 2 * np.log(log_var) - n / 2

    def ratio(theta: FloatArray) -> FloatArray:
        d = log_mean - theta
        u = 2 * (np.sqrt(1 + log_var + d**2) - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return 2 * (l_max + n / 2 * np.log(u) + n * (log_var + (d + u / 2) ** 2) / (2 * u))

    bounds = []
    for reach in (-PROFILE_REACH, PROFILE_REACH):
        inside, outside = top.copy(), top + reach
        for _ in range(PROFILE_STEPS):
            middle = (inside + outside) / 2
            within = ratio(middle) <= c
            inside = np.where(within, middle, inside)
            outside = np.where(within, outside, middle)
        bounds.append(inside)
    return bounds[0], bounds[1]


def _mid_p(k: IntArray, n: IntArray, level: float) -> tuple[FloatArray, FloatArray]:
    """The mid-p exact interval for a binomial share, k of n (0 < k < n), per element."""
    found = [
        _mid_p_bounds(int(a), int(b), level) for a, b in zip(k.ravel(), n.ravel(), strict=True)
    ]
    bounds = np.asarray(found, dtype=np.float64).reshape((*k.shape, 2))
    return bounds[..., 0], bounds[..., 1]


@functools.lru_cache(maxsize=4096)
def _mid_p_bounds(k: int, n: int, level: float) -> tuple[float, float]:
    """The shares p where the mid-p tail beyond k, P(X > k) + P(X = k) / 2 (below: P(X < k) +
    P(X = k) / 2), is (1 - level) / 2 for X ~ binomial(n, p) (Lancaster 1961; Agresti & Gottard
    2005): Clopper-Pearson's exact interval with half the observed count's probability in each
    tail, which takes its over-coverage away."""
    tail = (1 - level) / 2

    def above(p: float) -> float:
        return float(stats.binom.sf(k, n, p) + stats.binom.pmf(k, n, p) / 2) - tail

    def below(p: float) -> float:
        return float(stats.binom.cdf(k - 1, n, p) + stats.binom.pmf(k, n, p) / 2) - tail

    eps = 1e-12
    return (
        float(optimize.brentq(above, eps, 1 - eps, xtol=1e-14)),
        float(optimize.brentq(below, eps, 1 - eps, xtol=1e-14)),
    )


def _effective_wilson(
    mean: FloatArray, sd: FloatArray, n: IntArray, level: float, bounds: tuple[float, float]
) -> tuple[FloatArray, FloatArray]:
    """The Wilson score interval for the mean's position p in `bounds`, on the effective number
    of tasks n / deff (Kish's design effect deff = s^2 / (p (1 - p)), the sample variance over
    the largest a mean p allows; Korn & Graubard 1998 use it so for survey proportions). On 0/1
    values it is Wilson's interval with n - 1 tasks (s^2 is the unbiased variance; with the
    n-divisor, Wilson's own, 0/1 attempts x8 covered 0.933 at 20 tasks against 0.939). Like
    Wilson's it reaches further from the nearer end than towards it, which is where the plain t
    misses values piled at 0, and it stays inside the range. The normal quantile, as Wilson's:
    with t_{n-1} it over-covered (0.979, zero-heavy ties at 20 tasks, 4,000 studies)."""
    low, high = bounds
    z = float(stats.norm.ppf(1 - (1 - level) / 2))
    p = (mean - low) / (high - low)
    with np.errstate(invalid="ignore", divide="ignore"):
        deff = (sd / (high - low)) ** 2 / (p * (1 - p))
        c = z**2 * deff / n  # z^2 / effective number of tasks
        centre = (p + c / 2) / (1 + c)
        half = np.sqrt(c * p * (1 - p) + c**2 / 4) / (1 + c)
    return low + (centre - half) * (high - low), low + (centre + half) * (high - low)


def paired_interval(
    a: FloatArray,
    b: FloatArray,
    level: float = 0.95,
    *,
    bounds: tuple[float, float] | None = None,
) -> TaskInterval:
    """Interval for the mean over tasks of `b - a` (`[..., tasks, columns]`, NaN = no value),
    over the tasks where both groups have a value; `bounds` is the scores' known range.

    MOVER (Zou & Donner 2008) combines each group's interval over those tasks with the groups'
    correlation across them: without a known range the groups' own intervals (log-scale where
    a group's values are all above 0), each side held to MAX_MOVER_STRETCH t half-widths of the
    differences; on a known range with some task at an end of it, the groups' t-intervals held
    inside the range, a group whose tasks all sit at an end entering with its exact bound.
    Otherwise (a known range, no task at an end) the skew-corrected t on the differences. A
    column whose differences all tie gets the differences' own rule (no interval, or the exact
    bound at an end of their range); bounds stay inside [low - high, high - low].
    """
    both = ~np.isnan(a) & ~np.isnan(b)
    x_a = np.where(both, np.asarray(a, dtype=np.float64), np.nan)
    x_b = np.where(both, np.asarray(b, dtype=np.float64), np.nan)
    spread = None if bounds is None else (bounds[0] - bounds[1], bounds[1] - bounds[0])
    diff = task_interval(x_b - x_a, level, log_scale=False, bounds=spread)
    n = diff.n_tasks
    with np.errstate(invalid="ignore", divide="ignore"):
        q = stats.t.ppf(1 - (1 - level) / 2, np.maximum(n - 1, 1))
        scale = q / np.sqrt(np.maximum(n, 1))
        t_half = scale * _moments(x_b - x_a, both, n)[1]
    if bounds is None:
        below_a, above_a = _distances(task_interval(x_a, level, profile=False))
        below_b, above_b = _distances(task_interval(x_b, level, profile=False))
        kind, use = _MOVER_LOG, np.ones(n.shape, dtype=bool)
    else:
        below_a, above_a = _plain_distances(x_a, both, level, bounds, scale)
        below_b, above_b = _plain_distances(x_b, both, level, bounds, scale)
        at_end = (x_a <= bounds[0]) | (x_a >= bounds[1]) | (x_b <= bounds[0]) | (x_b >= bounds[1])
        kind, use = _MOVER_T, np.any(at_end, axis=-2)
    r = _correlation(x_a, x_b, both)
    if bounds is None:  # skewed values: a Pearson r over few tasks follows the largest one
        r = np.minimum(r, _log_normal_correlation(x_a, x_b, both))
    r = np.minimum(r, MAX_MOVER_CORRELATION)
    # Zou & Donner (2008): the lower side of b - a pairs b's lower reach with a's upper one.
    lo = diff.mean - np.sqrt(np.maximum(below_b**2 + above_a**2 - 2 * r * below_b * above_a, 0))
    hi = diff.mean + np.sqrt(np.maximum(above_b**2 + below_a**2 - 2 * r * above_b * below_a, 0))
    if spread is None:
        # Where the groups move together the margins' asymmetries cancel in the differences
        # (a constant gap between groups whose tasks differ by factors); MOVER would add them.
        lo = np.maximum(lo, diff.mean - MAX_MOVER_STRETCH * t_half)
        hi = np.minimum(hi, diff.mean + MAX_MOVER_STRETCH * t_half)
    else:
        lo, hi = np.clip(lo, *spread), np.clip(hi, *spread)
    use &= (n >= MIN_TASKS) & ~diff.tied
    return TaskInterval(
        mean=diff.mean,
        lo=np.where(use, lo, diff.lo),
        hi=np.where(use, hi, diff.hi),
        n_tasks=n,
        kind=np.where(use, kind, diff.kind),
        tied=diff.tied,
    )


def _distances(got: TaskInterval) -> tuple[FloatArray, FloatArray]:
    """How far a group's interval reaches below and above its mean; 0 where it has none (its
    tasks all tie: it adds no width to the difference's)."""
    return (
        np.nan_to_num(got.mean - got.lo, nan=0.0),
        np.nan_to_num(got.hi - got.mean, nan=0.0),
    )


def _plain_distances(
    x: FloatArray,
    present: BoolArray,
    level: float,
    bounds: tuple[float, float],
    scale: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """A group's plain t-interval as distances below and above its mean, held inside `bounds`;
    where its tasks all sit at an end, the exact bound's distances (`task_interval`)."""
    n = present.sum(axis=-2)
    mean, sd, _ = _moments(x, present, n)
    below = np.minimum(scale * sd, mean - bounds[0])
    above = np.minimum(scale * sd, bounds[1] - mean)
    edge = task_interval(x, level, bounds=bounds)
    at_end = edge.tied & ~np.isnan(edge.lo)
    edge_below, edge_above = _distances(edge)
    return np.where(at_end, edge_below, below), np.where(at_end, edge_above, above)


def _correlation(a: FloatArray, b: FloatArray, both: BoolArray) -> FloatArray:
    """Pearson correlation over the tasks with both values; 0 where a group has no spread."""
    n = both.sum(axis=-2)
    mean_a, sd_a, _ = _moments(a, both, n)
    mean_b, sd_b, _ = _moments(b, both, n)
    dev_a = np.where(both, a - np.expand_dims(mean_a, -2), 0.0)
    dev_b = np.where(both, b - np.expand_dims(mean_b, -2), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (dev_a * dev_b).sum(axis=-2) / np.maximum(n - 1, 1) / (sd_a * sd_b)
    return np.clip(np.where((sd_a > 0) & (sd_b > 0), r, 0.0), -1.0, 1.0)


def _log_normal_correlation(a: FloatArray, b: FloatArray, both: BoolArray) -> FloatArray:
    """The correlation of the groups' values that a bivariate log-normal model implies from
    their logs: (e^(r s_a s_b) - 1) / sqrt((e^(s_a^2) - 1) (e^(s_b^2) - 1)), with r the logs'
    correlation and s the logs' standard deviations; +1 (no bound on the Pearson r it is the
    minimum with) where some value is 0 or below.

    A Pearson r over 3-10 skewed tasks follows the task where both groups score highest, and it
    comes out near 1 where that task dominates both samples; MOVER, taking r as known, then
    narrows the difference's interval most where the sample says least about the heavier tail."""
    positive = both & (a > 0) & (b > 0)
    log_a = np.log(np.where(positive, a, 1.0))
    log_b = np.log(np.where(positive, b, 1.0))
    n = positive.sum(axis=-2)
    r_log = _correlation(log_a, log_b, positive)
    _, s_a, _ = _moments(log_a, positive, n)
    _, s_b, _ = _moments(log_b, positive, n)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        implied = np.expm1(r_log * s_a * s_b) / np.sqrt(np.expm1(s_a**2) * np.expm1(s_b**2))
    usable = (positive.sum(axis=-2) == both.sum(axis=-2)) & (s_a > 0) & (s_b > 0)
    return np.where(usable & np.isfinite(implied), np.clip(implied, -1.0, 1.0), 1.0)


def _moments(x: FloatArray, present: BoolArray, n: IntArray) -> tuple[FloatArray, ...]:
    """Mean, standard deviation (n - 1) and skewness over the task axis, NaN-aware."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.where(present, x, 0.0).sum(axis=-2) / np.maximum(n, 1), np.nan)
        dev = np.where(present, x - np.expand_dims(mean, -2), 0.0)
        sd = np.sqrt((dev**2).sum(axis=-2) / np.maximum(n - 1, 1))
        m3 = (dev**3).sum(axis=-2) / np.maximum(n, 1)
        skew = np.where(sd > 0, m3 / np.where(sd > 0, sd, 1.0) ** 3, 0.0)
    return mean, sd, skew
