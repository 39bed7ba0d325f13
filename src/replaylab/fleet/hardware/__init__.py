"""GPU replicas as hardware: profiles (service time, power, KV, cost, with provenance), the
power and throughput curves fitted to measurements (curves.py), and the analytic capacity
sizing the autoscaling planners use (capacity.py).
"""
