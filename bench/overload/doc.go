// Package overload holds the overload-protection benchmarks of issue 13:
// no protection, the best static concurrency limit, failsafe-go's adaptive
// limiters and Sluice's adaptive.Guard, fed the same seeded open-loop
// arrivals by one harness, on a virtual clock (testing/synctest) and over
// loopback. It has no code outside its tests; failsafe-go and gonum/plot
// are benchmark-only dependencies that only these tests import. Figures
// are in bench/RESULTS.md, section 11.
package overload
