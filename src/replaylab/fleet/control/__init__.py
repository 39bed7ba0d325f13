"""Acting on the fleet: autoscaling controllers (controllers.py), forecast-driven signed
recommendations and their inbox (recommendations.py), the events-v1 log of recommendation,
decision, actuation and outcome (events.py), and shadow evaluation of a candidate policy
(shadow.py).
"""
