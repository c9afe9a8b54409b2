"""This machine: the local Kafka and Spark cluster, processes, memory and CPU shares, the streams' status
files, and the command-line configuration that finds them."""
