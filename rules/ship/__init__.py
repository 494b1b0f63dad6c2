"""TODO ship"""
