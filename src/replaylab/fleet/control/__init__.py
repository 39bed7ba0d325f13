"""Acting on the fleet: autoscaling controllers (controllers.py), forecast-driven signed
recommendations and their inbox (recommendations.py), and shadow evaluation of a candidate
policy (shadow.py). The events-v1 contract they log (recommendation, decision, actuation,
outcome; signing) is `replaylab.contracts.events`.
"""
