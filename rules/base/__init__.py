"""TODO base"""
