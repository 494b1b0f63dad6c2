"""TODO share"""
