"""TODO plan"""
