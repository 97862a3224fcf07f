# Hadoop flow sizes: SIZE (bytes) and cumulative probability, one pair per line.
# Source: Facebook's Hadoop cluster traffic measured in A. Roy et al., "Inside the Social
# Network's (Datacenter) Network", SIGCOMM 2015, in the form the congestion-control
# simulations use it (HPCC, Li et al., SIGCOMM 2019: traffic_gen/FbHdp_distribution.txt of
# github.com/alibaba-edu/High-Precision-Congestion-Control, there in percent).
# Mostly small flows: 60 % under 1 KB, a heavy tail to 10 MB.
# Use: ibjitter run ... --size hadoop.cdf (or --flow-sizes).
0 0
100 0.01
200 0.02
300 0.05
350 0.15
400 0.20
500 0.30
600 0.40
700 0.50
1000 0.60
2000 0.67
7000 0.70
30000 0.72
50000 0.82
80000 0.87
120000 0.90
300000 0.95
1000000 0.975
2000000 0.99
10000000 1
