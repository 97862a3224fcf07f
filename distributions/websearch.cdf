# Web search flow sizes: SIZE (bytes) and cumulative probability, one pair per line.
# Source: the web-search cluster workload measured in M. Alizadeh et al., "Data Center TCP
# (DCTCP)", SIGCOMM 2010 (Fig. 4, background flows), in the form the congestion-control
# simulations use it (HPCC, Li et al., SIGCOMM 2019: traffic_gen/WebSearch_distribution.txt
# of github.com/alibaba-edu/High-Precision-Congestion-Control, there in percent).
# Mean 1.71 MB (linear between the points); half of the flows under 73 KB, the largest 30 MB.
# Use: ibjitter run ... --size websearch.cdf (or --flow-sizes), --size-scale to shrink it.
0 0
10000 0.15
20000 0.20
30000 0.30
50000 0.40
80000 0.53
200000 0.60
1000000 0.70
2000000 0.80
5000000 0.90
10000000 0.97
30000000 1
