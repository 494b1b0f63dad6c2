"""TODO tune"""
